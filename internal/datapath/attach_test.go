package datapath

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"

	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// throwawayNetns creates a namespace with a veth pair (veth-a, veth-b) and removes it
// when the test ends.
func throwawayNetns(t *testing.T) string {
	t.Helper()
	ns := testutil.NetNS(t, "mptdp-")
	if out, err := exec.Command("ip", "-n", ns, "link", "add", "name", "veth-a", "type", "veth", "peer", "name", "veth-b").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v: %s", err, out)
	}
	return "/var/run/netns/" + ns
}

func bpffsPinDir(t *testing.T) string {
	t.Helper()
	if err := os.MkdirAll("/sys/fs/bpf", 0o755); err != nil {
		t.Fatal(err)
	}
	if exec.Command("mountpoint", "-q", "/sys/fs/bpf").Run() != nil {
		testutil.Unavailable(t, "bpffs is not mounted at /sys/fs/bpf")
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	dir := filepath.Join("/sys/fs/bpf", "mptdp-test-"+hex.EncodeToString(b))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Links are pinned, survive the loader closing its file descriptors, are
// re-adopted by a second load, and go away on Detach.
func TestAttachPinsAndReadoptsLinks(t *testing.T) {
	ns := throwawayNetns(t)
	pin := bpffsPinDir(t)
	att := Attachment{Interface: "veth-a", Hook: HookPodEgress}

	err := netnsutil.Do(ns, func() error {
		dp, err := Load(Options{PinDir: pin})
		if err != nil {
			return err
		}
		defer dp.Close()
		if err := dp.Attach(att); err != nil {
			return err
		}
		// A second agent run adopts the link instead of adding another.
		dp2, err := Load(Options{PinDir: pin})
		if err != nil {
			return err
		}
		defer dp2.Close()
		return dp2.Attach(att)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := attachedCount(t, ns, "veth-a", ebpf.AttachTCXIngress); n != 1 {
		t.Fatalf("%d programs on veth-a's TCX ingress, want exactly 1", n)
	}
	if err := netnsutil.Do(ns, func() error {
		dp, err := Load(Options{PinDir: pin})
		if err != nil {
			return err
		}
		defer dp.Close()
		return dp.Detach(att)
	}); err != nil {
		t.Fatal(err)
	}
	if n := attachedCount(t, ns, "veth-a", ebpf.AttachTCXIngress); n != 0 {
		t.Fatalf("%d programs on veth-a's TCX ingress after Detach, want 0", n)
	}
}

// attachedCount asks the kernel how many programs sit on a TCX hook.
func attachedCount(t *testing.T, ns, iface string, at ebpf.AttachType) int {
	t.Helper()
	var n int
	if err := netnsutil.Do(ns, func() error {
		ifc, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: ifc.Index, Attach: at})
		if err != nil {
			return err
		}
		n = len(res.Programs)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}
