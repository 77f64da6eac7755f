package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"testing"
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
