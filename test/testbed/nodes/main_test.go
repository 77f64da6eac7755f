package nodes_test

import (
	"log/slog"
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
)

func TestMain(m *testing.M) {
	// envtest logs through controller-runtime: errors only, to stderr
	// (without a logger it prints a stack trace instead).
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	code := m.Run()
	treeImages.Remove()
	os.Exit(code)
}

// treeImages are the project's images, built (or read from
// $MPTCP_TEST_IMAGES) once for the package's tests.
// images is what the last testImages returned, for trafficPod.
var (
	treeImages nodes.TestImages
	images     nodes.Images
)

func testImages(t *testing.T) nodes.Images {
	t.Helper()
	images = treeImages.ForTest(t)
	return images
}
