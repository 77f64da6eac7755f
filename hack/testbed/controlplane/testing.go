package controlplane

import (
	"context"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/internal/controller/testenv"
)

// StartForTest builds cmd/controller and starts a control plane for a test,
// stopped when the test ends. Without KUBEBUILDER_ASSETS the test is skipped
// with the reason (failed under CI=true), as testenv.Start does.
func StartForTest(t testing.TB) *ControlPlane {
	t.Helper()
	assets := testenv.Assets(t)
	bin, err := BuildController(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cp, err := Start(context.Background(), Options{Assets: assets, Dir: t.TempDir(), Controller: bin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return cp
}
