package linkwatch

import (
	"context"
	"io"
	"log/slog"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// A veth pair in a throwaway namespace: its carrier going and coming, a
// rename and a deletion each reach the handler as they happen.
func TestCarrierRenameAndDeletionArriveAsTheyHappen(t *testing.T) {
	testutil.RequireRoot(t, "ip")
	ns := testutil.NetNS(t, "lw")
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ip("link", "add", "nic1", "type", "veth", "peer", "name", "wire1")
	ip("link", "set", "nic1", "up")
	ip("link", "set", "wire1", "up")

	changes := make(chan Change, 64)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	subscribed := make(chan error, 1)
	go func() {
		// The subscription's socket lives in the namespace of the
		// thread that opens it.
		runtime.LockOSThread()
		h, err := netns.GetFromName(ns)
		if err != nil {
			subscribed <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			subscribed <- err
			return
		}
		subscribed <- nil
		Watch(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c Change, resync bool) {
			if !resync {
				changes <- c
			}
		})
		// The thread stays in the test namespace: it ends with this
		// goroutine (locked, never unlocked).
	}()
	if err := <-subscribed; err != nil {
		t.Fatal(err)
	}
	// await returns the first change of name matching want.
	await := func(what, name string, want func(Change) bool) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case c := <-changes:
				if c.Name == name && want(c) {
					return
				}
			case <-deadline:
				t.Fatalf("%s: no change of %s within 5 s", what, name)
			}
		}
	}
	await("existing link", "nic1", func(c Change) bool { return c.Running })

	ip("link", "set", "wire1", "down")
	await("carrier lost", "nic1", func(c Change) bool { return !c.Running && !c.Gone })
	ip("link", "set", "wire1", "up")
	await("carrier back", "nic1", func(c Change) bool { return c.Running })

	ip("link", "set", "nic1", "down")
	ip("link", "set", "nic1", "name", "nic9")
	await("renamed away", "nic1", func(c Change) bool { return c.Gone })
	ip("link", "del", "nic9")
	await("deleted", "nic9", func(c Change) bool { return c.Gone })
}
