// Package e2e runs the whole system on the test bed: real namespaces, real
// MPTCP connections, the real agent binary, placements checked from packet
// captures decoded by tshark.
package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/mptcp-operator/mptcp-operator/test/framework"
)

// bins are built once for the whole package, into binDir.
var (
	bins   framework.Binaries
	binDir string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	// The control plane's libraries log through controller-runtime: errors
	// only, to stderr (without a logger it prints a stack trace instead).
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	dir, err := os.MkdirTemp("", "mptcp-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	if bins, err = framework.BuildBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The images, when a test built them (testImages).
	defer treeImages.Remove()
	return m.Run()
}

func background(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}
