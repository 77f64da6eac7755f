package nodes

import (
	"context"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/controlplane"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// RequireTools calls testbed.Unavailable (fatal under CI=true, a skip with
// the reason otherwise) when the machine lacks what real nodes need.
func RequireTools(t testing.TB) {
	t.Helper()
	testbed.RequireRoot(t)
	testbed.RequireTools(t, Tools...)
	if err := checkPrerequisites(Options{Assets: testenv.Assets(t), SandboxImage: "-", Images: []Image{{Ref: "-"}}}); err != nil {
		testbed.Unavailable(t, "%v", err)
	}
}

// StartForTest brings the bed's nodes up as real nodes against cp (started
// with Options.Cluster), with every image imported and the pause image as
// the sandbox, and stops them when the test ends, passed or failed. Each of
// mods, if any, changes the options first (Options.Flannel).
func StartForTest(t testing.TB, bed *testbed.Bed, cp *controlplane.ControlPlane, images Images, mods ...func(*Options)) *Cluster {
	t.Helper()
	RequireTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	o := Options{Bed: bed, ControlPlane: cp, Assets: testenv.Assets(t), Images: images.All(), SandboxImage: images[PauseImage].Ref}
	for _, mod := range mods {
		mod(&o)
	}
	c, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("real nodes: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the real nodes: %v", err)
		}
	})
	t.Logf("%d real nodes Ready in %s", len(c.Nodes), time.Since(start).Round(10*time.Millisecond))
	return c
}
