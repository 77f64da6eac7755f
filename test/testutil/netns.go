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

// NetNSPair creates two network namespaces (NetNS, with prefix) joined by a
// veth, eth0 in each, up: the client's end 192.0.2.1/24, the server's
// 192.0.2.2/24. Both go when the test ends.
func NetNSPair(t testing.TB, prefix string) (client, server string) {
	t.Helper()
	client, server = NetNS(t, prefix+"c-"), NetNS(t, prefix+"s-")
	for _, args := range [][]string{
		{"-n", client, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", server},
		{"-n", client, "addr", "add", "192.0.2.1/24", "dev", "eth0"},
		{"-n", server, "addr", "add", "192.0.2.2/24", "dev", "eth0"},
		{"-n", client, "link", "set", "eth0", "up"},
		{"-n", server, "link", "set", "eth0", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	return client, server
}
