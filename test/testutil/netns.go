package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// NetNS creates a network namespace named prefix plus a random suffix,
// deletes it when the test ends, and returns its name (its path is
// /var/run/netns/<name>). It needs root and ip: RequireRoot decides.
func NetNS(t testing.TB, prefix string) string {
	t.Helper()
	RequireRoot(t, "ip")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}

// InNetNS runs f on an OS thread in the named namespace and waits for it:
// sockets f opens live there. The thread is never unlocked, so it ends with
// f rather than go back to the runtime's pool in the wrong namespace.
func InNetNS(t testing.TB, ns string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		h, err := netns.GetFromName(ns)
		if err != nil {
			t.Errorf("namespace %s: %v", ns, err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			t.Errorf("entering %s: %v", ns, err)
			return
		}
		f()
	}()
	<-done
}
