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

// pinnedAttach is a throwaway namespace, a pin directory and pod_egress's
// attachment to its veth-a: what the tests of pinned links share. attached
// runs in the namespace with a datapath loaded with those pins that has
// attached it.
func pinnedAttach(t *testing.T, attached func(dp *Datapath, pin string, att Attachment) error) (ns, pin string, att Attachment) {
	t.Helper()
	ns, pin = throwawayNetns(t), bpffsPinDir(t)
	att = Attachment{Interface: "veth-a", Hook: HookPodEgress}
	if err := netnsutil.Do(ns, func() error {
		dp, err := Load(Options{PinDir: pin})
		if err != nil {
			return err
		}
		defer dp.Close()
		if err := dp.Attach(att); err != nil {
			return err
		}
		return attached(dp, pin, att)
	}); err != nil {
		t.Fatal(err)
	}
	return ns, pin, att
}

// Links are pinned, survive the loader closing its file descriptors, are
// re-adopted by a second load, and go away on Detach.
func TestAttachPinsAndReadoptsLinks(t *testing.T) {
	ns, pin, att := pinnedAttach(t, func(_ *Datapath, pin string, att Attachment) error {
		// A second agent run adopts the link instead of adding another.
		dp2, err := Load(Options{PinDir: pin})
		if err != nil {
			return err
		}
		defer dp2.Close()
		return dp2.Attach(att)
	})
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

// A pinned link that another program runs before (an earlier agent attached
// its links last, or another tool went to the head since) goes back to the
// head: when the same agent attaches again, and when a later agent adopts
// it. The other program stays, one link of the agent's is left, and it is
// the pinned one.
func TestAReadoptedLinkGoesBackToTheHead(t *testing.T) {
	pinnedAttach(t, func(dp *Datapath, pin string, att Attachment) error {
		other, err := Load(Options{})
		if err != nil {
			return err
		}
		defer other.Close()
		ifc, err := net.InterfaceByName(att.Interface)
		if err != nil {
			return err
		}
		// otherFirst puts another tool's program at the head.
		otherFirst := func() (link.Link, error) {
			return link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: other.objs.NicIngress, Attach: ebpf.AttachTCXIngress, Anchor: link.Head()})
		}
		for _, again := range []struct {
			name string
			dp   *Datapath
		}{{"the same agent", dp}, {"a later agent", nil}} {
			ol, err := otherFirst()
			if err != nil {
				return err
			}
			a := again.dp
			if a == nil {
				if a, err = Load(Options{PinDir: pin}); err != nil {
					return err
				}
			}
			err = a.Attach(att)
			if a != dp {
				a.Close()
			}
			if err != nil {
				return err
			}
			pinned, err := link.LoadPinnedLink(dp.linkPin(att), nil)
			if err != nil {
				return err
			}
			info, err := pinned.Info()
			pinned.Close()
			if err != nil {
				return err
			}
			res, err := link.QueryPrograms(link.QueryOptions{Target: ifc.Index, Attach: ebpf.AttachTCXIngress})
			if err != nil {
				return err
			}
			first, _ := res.Programs[0].LinkID()
			if len(res.Programs) != 2 || first != info.ID {
				t.Errorf("after %s attached again: %d programs, the first by link %d; want 2, the first the pinned link %d", again.name, len(res.Programs), first, info.ID)
			}
			ol.Close()
		}
		return nil
	})
}
