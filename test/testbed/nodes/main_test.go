package nodes_test

import (
	"log/slog"
	"os"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

func TestMain(m *testing.M) {
	// envtest logs through controller-runtime: errors only, to stderr
	// (without a logger it prints a stack trace instead).
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	code := m.Run()
	if imagesDir != "" {
		os.RemoveAll(imagesDir)
	}
	os.Exit(code)
}

var (
	imagesOnce sync.Once
	imagesDir  string
	images     nodes.Images
	imagesErr  error
)

// testImages builds the project's images (make images' builder, IMAGEBUILD)
// once for the package's tests.
func testImages(t *testing.T) nodes.Images {
	t.Helper()
	builder := testutil.BuiltTool(t, "IMAGEBUILD", "imagebuild")
	imagesOnce.Do(func() {
		if imagesDir, imagesErr = os.MkdirTemp("", "nodes-images-"); imagesErr == nil {
			images, imagesErr = nodes.BuildImages(builder, imagesDir)
		}
	})
	if imagesErr != nil {
		t.Fatalf("building the images: %v", imagesErr)
	}
	return images
}
