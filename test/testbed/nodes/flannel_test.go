package nodes_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/controlplane"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// A real flanneld on the bed's real nodes, with flannel's Kubernetes subnet
// manager, and pods on flannel's bridge (the configuration flannel's CNI
// plugin delegates to: nodes.Flannel): the bed TestCNI's flannel rows run
// on, and the kernel behaviour steering an overlay by marks rests on.
func TestFlannel(t *testing.T) {
	testbed.RequireRoot(t)
	nodes.RequireTools(t)
	flanneld := testutil.BuiltTool(t, "FLANNELD", "flanneld")
	images := testImages(t)

	// VXLAN, steered by a mark: what steering an overlay's subflows rests
	// on. flannel.1 is flannel's VXLAN device on every node, its lease in
	// the Node's annotations, and its FDB entries to the peers' VTEPs name
	// no device, so the outer packets' route is not bound to --iface. The
	// kernel's outer route lookup (udp_tunnel_dst_lookup, from
	// vxlan_xmit_one) takes the inner packet's skb->mark, so a fwmark rule
	// picks the outer packets' NIC; decapsulation keeps the outer packet's
	// mark on the inner one. The bed's fabrics are an underlay: they route
	// each node's VTEP address (its Loopback, flanneld's --public-ip) and
	// no pod CIDR; the nodes filter reverse paths loosely here (the outer
	// source is the same whatever the NIC). iptables stands in for the
	// agent's programs: it marks what node 1's pods send, path 2's table routes only the VTEP addresses (the
	// inner packet keeps flannel.1 from the main table), and node 2 marks
	// the outer packets arriving on nic2.
	vtep := func(n *testbed.Node) netip.Addr { return n.Loopback }
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, Underlay: true})
	for _, n := range bed.Nodes {
		nsOut(t, n.NetNS, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=2")
	}
	cp, c := flannelNodes(t, bed, images, &nodes.Flannel{Flanneld: flanneld, Backend: "vxlan"})
	for _, n := range c.Nodes {
		if out := nsOut(t, n.Bed.NetNS, "ip", "-d", "link", "show", "flannel.1"); !strings.Contains(out, "vxlan id 1") {
			t.Fatalf("node %s: flannel.1 is not flannel's vxlan device:\n%s", n.Name, out)
		}
		node := &corev1.Node{}
		if err := cp.Client.Get(context.Background(), client.ObjectKey{Name: n.Name}, node); err != nil {
			t.Fatal(err)
		}
		if node.Annotations["flannel.alpha.coreos.com/backend-type"] != "vxlan" {
			t.Fatalf("node %s has no vxlan lease in its annotations: %v", n.Name, node.Annotations)
		}
		fdb := nsOut(t, n.Bed.NetNS, "bridge", "fdb", "show", "dev", "flannel.1")
		if !strings.Contains(fdb, "dst "+vtep(c.Node(3-n.Bed.Index).Bed).String()) || strings.Contains(fdb, " via ") {
			t.Fatalf("node %s: FDB %s, want an entry to the peer's VTEP without a device", n.Name, fdb)
		}
	}
	n1, n2 := c.Node(1).Bed, c.Node(2).Bed
	nsOut(t, n1.NetNS, "ip", "route", "add", "10.100.0.0/24", "via", n1.NIC(2).Gateway.String(), "dev", "nic2", "table", "102")
	nsOut(t, n1.NetNS, "ip", "rule", "add", "fwmark", "0x100000/0xf00000", "lookup", "102", "pref", "100")
	nsOut(t, n1.NetNS, "iptables", "-t", "mangle", "-A", "PREROUTING", "-i", "cni0", "-j", "MARK", "--set-xmark", "0x100000/0xf00000")
	nsOut(t, n2.NetNS, "iptables", "-t", "mangle", "-A", "PREROUTING", "-i", "nic2", "-p", "udp", "--dport", "8472", "-j", "MARK", "--set-xmark", "0x200000/0xf00000")
	const size = 4 << 20
	var inner func() map[string]uint64
	d := podTransfer(t, cp, c, size, "cni0", func(server string) func() map[string]uint64 {
		if got := nsOut(t, n1.NetNS, "ip", "route", "get", server, "mark", "0x100000"); !strings.Contains(got, "dev flannel.1") {
			t.Fatalf("node 1's route to the server pod %s for a marked packet: %s, want it through flannel.1", server, got)
		}
		inner = chainCounters(t, n2.NetNS, "PREROUTING", map[string]string{
			"inner": "-i flannel.1 -d " + server, "inner marked": "-i flannel.1 -d " + server + " -m mark --mark 0x200000/0xf00000",
		})
		return outCounters(t, n1.NetNS, map[string]string{
			"nic1 vxlan": "-o nic1 -p udp --dport 8472", "nic2 vxlan": "-o nic2 -p udp --dport 8472",
			"nic2 plain": "-o nic2 -d " + nodes.FlannelNetwork.String(), "flannel.1": "-o flannel.1 -d " + server,
		})
	})
	if d["flannel.1"] < size || d["nic2 vxlan"] < size || d["nic1 vxlan"] != 0 || d["nic2 plain"] != 0 {
		t.Fatalf("node 1 sent (bytes) %v during a %d-byte transfer: want it all through flannel.1 and out of nic2 in VXLAN", d, size)
	}
	if got := inner(); got["inner"] < size || got["inner marked"] != got["inner"] {
		t.Fatalf("node 2 received (bytes) %v from flannel.1: want every inner packet with the mark its outer packet got on nic2", got)
	}
}

// flannelNodes starts the control plane and the bed's nodes with flannel.
func flannelNodes(t *testing.T, bed *testbed.Bed, images nodes.Images, f *nodes.Flannel) (*controlplane.ControlPlane, *nodes.Cluster) {
	t.Helper()
	cp := startCluster(t)
	start := time.Now()
	c, err := nodes.Start(context.Background(), nodes.Options{
		Bed: bed, ControlPlane: cp, Assets: testenv.Assets(t),
		Images: images.All(), SandboxImage: images[nodes.PauseImage].Ref,
		Flannel: f,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop the real nodes: %v", err)
		}
	})
	t.Logf("2 real nodes with flanneld (%s) Ready in %s", f.Backend, time.Since(start).Round(100*time.Millisecond))
	for _, n := range c.Nodes {
		env, err := n.ReadFlannelEnv()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("node %s: subnet.env %+v", n.Name, env)
		if env.Subnet.Masked() != n.Bed.PodCIDR {
			t.Fatalf("node %s: flannel's subnet %s is not the Node's podCIDR %s", n.Name, env.Subnet, n.Bed.PodCIDR)
		}
	}
	return cp, c
}

// podTransfer runs a server pod on node 2 and a client pod on node 1
// that sends size bytes over MPTCP, and checks both ends' reports. The
// server pod's host interface must start with hostIf (the CNI's). setup,
// given the server pod's address, returns a probe of byte counters; the
// counters' growth during the transfer is returned.
func podTransfer(t *testing.T, cp *controlplane.ControlPlane, c *nodes.Cluster, size int, hostIf string,
	setup func(serverAddr string) func() map[string]uint64) map[string]uint64 {
	t.Helper()
	ctx := context.Background()
	server, serverPod := startServerOnNode2(t, cp, c)
	t.Logf("server pod %s on %s, host interface %s", serverPod.Addr, c.Node(2).Name, serverPod.HostIf)
	if !c.Node(2).Bed.PodCIDR.Contains(serverPod.Addr) || !strings.HasPrefix(serverPod.HostIf, hostIf) {
		t.Fatalf("server pod %s behind %q: want an address of %s behind %s*", serverPod.Addr, serverPod.HostIf, c.Node(2).Bed.PodCIDR, hostIf)
	}
	probe := setup(serverPod.Addr.String())
	before := probe()
	client1 := trafficPod("client", c.Node(1).Name, "send", "-to", serverPod.Addr.String()+":5201", "-mptcp",
		"-conns", "1", "-bytes", fmt.Sprint(size), "-seed", "14", "-json")
	if err := cp.Client.Create(ctx, client1); err != nil {
		t.Fatal(err)
	}
	client1 = waitPod(t, cp, c, client1, corev1.PodSucceeded)
	after := probe()
	sent := decodeLines[testbed.SenderReport](t, c.Node(1), client1)
	var got []testbed.ServerReport
	deadline := time.Now().Add(20 * time.Second)
	for len(got) == 0 && time.Now().Before(deadline) {
		got = decodeLines[testbed.ServerReport](t, c.Node(2), server)
		time.Sleep(100 * time.Millisecond)
	}
	if len(sent) != 1 || len(got) != 1 {
		t.Fatalf("want one report from each end, got %d sent and %d received", len(sent), len(got))
	}
	if !sent[0].MPTCP || !got[0].MPTCP || got[0].Bytes != int64(size) || got[0].SHA256 != sent[0].SHA256 {
		t.Fatalf("want %d bytes over MPTCP at both ends, same hash: sent %+v, received %+v", size, sent[0], got[0])
	}
	delta := map[string]uint64{}
	for k, v := range after {
		delta[k] = v - before[k]
	}
	t.Logf("%d bytes from %s to %s over MPTCP, sha256 %.12s; node 1 sent (bytes) %v", size, sent[0].Local, got[0].Local, got[0].SHA256, delta)
	return delta
}

// outCounters counts, in ns's mangle POSTROUTING, the bytes of the packets
// each rule (iptables match arguments) matches, and returns a probe of
// them. The rules go with the namespace.
func outCounters(t *testing.T, ns string, rules map[string]string) func() map[string]uint64 {
	t.Helper()
	return chainCounters(t, ns, "POSTROUTING", rules)
}

// chainCounters is outCounters in chain of ns's mangle table.
func chainCounters(t *testing.T, ns, chain string, rules map[string]string) func() map[string]uint64 {
	t.Helper()
	for name, match := range rules {
		nsOut(t, ns, append(append([]string{"iptables", "-t", "mangle", "-A", chain}, strings.Fields(match)...),
			"-m", "comment", "--comment", "fltest:"+name)...)
	}
	return func() map[string]uint64 {
		out := nsOut(t, ns, "iptables", "-t", "mangle", "-L", chain, "-v", "-x", "-n")
		got := map[string]uint64{}
		for _, line := range strings.Split(out, "\n") {
			i := strings.Index(line, "/* fltest:")
			if i < 0 {
				continue
			}
			name := strings.TrimSuffix(strings.TrimSpace(line[i+len("/* fltest:"):]), "*/")
			var pkts, bytes uint64
			fmt.Sscan(line, &pkts, &bytes)
			got[strings.TrimSpace(name)] = bytes
		}
		if len(got) != len(rules) {
			t.Fatalf("counters in %s: %v, want %d:\n%s", ns, got, len(rules), out)
		}
		return got
	}
}

func nsOut(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("in %s: %s: %v: %s", ns, strings.Join(args, " "), err, out)
	}
	return string(out)
}
