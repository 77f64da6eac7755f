package agent

import (
	"os/exec"
	"slices"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/cni"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// readHost is cniHost in the named namespace.
func readHost(t *testing.T, ns string) (h cni.Host) {
	t.Helper()
	var err error
	testutil.InNetNS(t, ns, func() { h, err = cniHost() })
	if err != nil {
		t.Fatalf("reading the node's network: %v", err)
	}
	return h
}

// What the CNI check reads of the node's network: every interface, those
// that hold an address (a device the CNI made but left bare is not its
// mode), and whether an xfrm policy matches marks as Cilium's IPsec does.
func TestTheCNICheckReadsLinksAddressesAndXfrmPolicies(t *testing.T) {
	ns := testutil.NetNS(t, "cnihost-")
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ip("link", "add", "bare0", "type", "veth", "peer", "name", "used0")
	ip("addr", "add", "192.0.2.1/32", "dev", "used0")

	before := readHost(t, ns)
	ip("xfrm", "policy", "add", "src", "10.0.0.0/8", "dst", "10.0.0.0/8", "dir", "out", "tmpl", "src", "192.0.2.1", "dst", "192.0.2.2",
		"proto", "esp", "reqid", "1", "mode", "tunnel")
	ip("xfrm", "policy", "add", "src", "10.0.0.0/8", "dst", "10.0.0.0/8", "dir", "fwd", "mark", "0x2a", "mask", "0xffffffff",
		"tmpl", "src", "192.0.2.1", "dst", "192.0.2.2", "proto", "esp", "reqid", "7", "mode", "tunnel")
	unmarked := readHost(t, ns)
	ip("xfrm", "policy", "add", "src", "10.0.0.0/8", "dst", "10.0.0.0/8", "dir", "in", "mark", "0x3d00", "mask", "0xff00",
		"tmpl", "src", "192.0.2.2", "dst", "192.0.2.1", "proto", "esp", "reqid", "1", "mode", "tunnel")
	after := readHost(t, ns)

	if !slices.Contains(before.Links, "bare0") || !slices.Contains(before.Links, "used0") {
		t.Errorf("links %v, want bare0 and used0 among them", before.Links)
	}
	if !slices.Contains(before.Addressed, "used0") || slices.Contains(before.Addressed, "bare0") {
		t.Errorf("addressed %v, want used0 and not bare0", before.Addressed)
	}
	if before.IPsec || unmarked.IPsec || !after.IPsec {
		t.Errorf("IPsec %v with no xfrm policy, %v with one that matches no mark and one another tunnel's, %v with one that matches Cilium's: want false, false, true",
			before.IPsec, unmarked.IPsec, after.IPsec)
	}
}
