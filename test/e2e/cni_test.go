package e2e

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/release"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// testFlannel(backend): real nodes whose CNI is a real flanneld (pods on
// flannel's bridge cni0), with its VXLAN backend (flannel.1 between the
// nodes) on fabrics that are an underlay: they route the nodes' VTEP
// addresses and no pod CIDR (testbed.Config.Underlay), as an overlay
// cluster's do; or with host-gw (each node routes the others' pod CIDRs
// to their addresses on nic1) on fabrics that are shared LANs and route
// nothing (testbed.Config.SharedLAN), as a host-gw cluster's do, where
// only the agent's direct routes take a subflow to a peer over nic2. With
// the chart installed as an admin installs it and examples/ applied, every
// agent's node checks pass the CNI it finds, and MPTCP
// between tenant pods of the two nodes spreads each connection's subflows
// over both NICs, every stream whole: the captures on the path NICs read
// each subflow's segments on one NIC both ways, inside VXLAN only or
// outside it only, as the backend says (the peer's replies follow the path
// its join arrived by, judged after decapsulation). A policy that shapes
// then makes each node Degraded (CapsNotEnforced): the tunnel, or the
// bridge, hides which pod sent a packet from the NIC's classifier.
func testFlannel(backend string) func(*testing.T) {
	return func(t *testing.T) {
		flanneld := testutil.BuiltTool(t, "FLANNELD", "flanneld")
		vxlan := backend == "vxlan"
		cb := startChartBedWith(t, testbed.Config{Nodes: 2, NICs: 2, LinkRate: "100mbit", Underlay: vxlan, SharedLAN: !vxlan},
			func(o *nodes.Options) {
				o.Flannel = &nodes.Flannel{Flanneld: flanneld, Backend: backend}
			})
		servers := cb.tenantServers(t)
		for _, n := range cb.bed.Nodes {
			if p := cb.attach(t, servers[n.Index]); !n.PodCIDR.Contains(p.Addr) || p.HostIf != "cni0" {
				t.Fatalf("server pod %s behind %q: want an address of %s behind flannel's bridge cni0", p.Addr, p.HostIf, n.PodCIDR)
			}
		}
		// As a kube bed's: liveness slow enough for clusters side by side,
		// one controller replica.
		cb.install(t, release.Chart(), cb.images, kubeBedValues...)
		cb.applyExamples(t, servers)
		// The bed writes the configuration flannel's own plugin delegates
		// to (nodes.Flannel): the agent names it as the bridge plugin's
		// unless flannel's VXLAN device shows.
		found := "bridge (bridge)"
		if vxlan {
			found = "flannel (vxlan)"
		}
		for _, n := range cb.bed.Nodes {
			requireNodeCheck(t, cb, n, "CNI", func(c mptcpv1alpha1.NodeCheck) bool {
				return c.Result == mptcpv1alpha1.CheckPassed && strings.HasPrefix(c.Message, found+" from /etc/cni/net.d/10-flannel.conflist")
			})
		}
		analysis, sent := cb.crossTransfer(t, servers)
		requireSpread(t, analysis, sent, "flannel "+backend)
		requireTunneled(t, analysis, vxlan)

		// Shape caps nothing that the tunnel encapsulates, or that the
		// bridge forwards: a policy that shapes makes every node Degraded
		// for it, naming the rule and why, and the rest stays enforced.
		hides := "behind a bridge"
		if vxlan {
			hides = "flannel.1"
		}
		applyObject(t, cb.c, &mptcpv1alpha1.MPTCPPolicy{}, `{"apiVersion":"mptcp.io/v1alpha1","kind":"MPTCPPolicy","metadata":{"name":"shaped"},
			"spec":{"namespaceSelector":{"matchLabels":{"mptcp.io/tenant":"enabled"}},
			"spread":{"paths":[{"name":"fabric-a"},{"name":"fabric-b"}]},"rateLimits":{"mode":"shape","perPod":"50M"}}}`)
		for _, n := range cb.bed.Nodes {
			requireNodeCondition(t, cb, n, func(c metav1.Condition) bool {
				return c.Type == mptcpv1alpha1.ConditionDegraded && c.Status == metav1.ConditionTrue &&
					c.Reason == mptcpv1alpha1.ReasonCapsNotEnforced && strings.Contains(c.Message, hides) &&
					strings.Contains(c.Message, "the rest of the spec is enforced")
			}, "Degraded for the shaping policy's caps")
		}
	}
}

// requireNodeCondition waits until one of node n's MPTCPNodeState
// conditions is as ok wants.
func requireNodeCondition(t *testing.T, cb *chartBed, n *testbed.Node, ok func(metav1.Condition) bool, what string) {
	t.Helper()
	var last []metav1.Condition
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var s mptcpv1alpha1.MPTCPNodeState
		if err := cb.c.Get(context.Background(), client.ObjectKey{Name: framework.NodeName(n)}, &s); err != nil {
			continue
		}
		last = s.Status.Conditions
		if i := slices.IndexFunc(last, ok); i >= 0 {
			t.Logf("node %d: %s %s %s: %s", n.Index, last[i].Type, last[i].Status, last[i].Reason, last[i].Message)
			return
		}
	}
	t.Fatalf("node %d: conditions %+v, want %s", n.Index, last, what)
}

// requireNodeCheck waits until node n's agent reports its check name as ok
// wants, in its MPTCPNodeState's status.checks.
func requireNodeCheck(t *testing.T, cb *chartBed, n *testbed.Node, name string, ok func(mptcpv1alpha1.NodeCheck) bool) {
	t.Helper()
	var last []mptcpv1alpha1.NodeCheck
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var s mptcpv1alpha1.MPTCPNodeState
		if err := cb.c.Get(context.Background(), client.ObjectKey{Name: framework.NodeName(n)}, &s); err != nil {
			continue
		}
		last = s.Status.Checks
		if i := slices.IndexFunc(last, func(c mptcpv1alpha1.NodeCheck) bool { return c.Name == name }); i >= 0 && ok(last[i]) {
			t.Logf("node %d: %s check %s: %s", n.Index, name, last[i].Result, last[i].Message)
			return
		}
	}
	t.Fatalf("node %d: checks %+v, want %s as the test says", n.Index, last, name)
}

// testCalico(mode): real nodes whose CNI is Calico, felix on iptables-nft
// and its CNI plugin (pods on cali<hash> veths with /32 routes), "routed"
// (the bed's fabrics route every pod CIDR, as fabrics that peer with the
// nodes would) or "vxlan" (fabrics that route the nodes' VTEP addresses
// only). felix marks with 0xffff0000, so the chart is installed with a mark
// mask outside it, as docs/install.md tells. Every agent names its CNI
// "calico (<mode>)"; with a Kubernetes NetworkPolicy that admits the
// servers' ingress from the client pods only, MPTCP from the clients of
// each node to the other's server spreads each connection's subflows over
// both NICs (inside VXLAN or not, as the mode says), streams whole; a
// connection from a server pod, which the policy denies, stays denied while
// the agent steers its subflows, and opens once the policy is gone.
func testCalico(mode string) func(*testing.T) {
	return func(t *testing.T) {
		dir := testutil.BuiltTool(t, "CALICO", "calico")
		cb := startChartBedWith(t, testbed.Config{Nodes: 2, NICs: 2, LinkRate: "100mbit", Underlay: mode == "vxlan"}, func(o *nodes.Options) {
			o.Calico = &nodes.Calico{Dir: dir, Mode: mode}
		})
		servers := cb.tenantServers(t)
		attached := map[int]*testbed.Pod{}
		for _, n := range cb.bed.Nodes {
			p := cb.attach(t, servers[n.Index])
			if !n.PodCIDR.Contains(p.Addr) || !strings.HasPrefix(p.HostIf, "cali") {
				t.Fatalf("server pod %s behind %q: want an address of %s behind a Calico veth cali*", p.Addr, p.HostIf, n.PodCIDR)
			}
			attached[n.Index] = p
		}
		cb.install(t, release.Chart(), cb.images, append([]string{"--set", "agent.markMask=0x00000f00"}, kubeBedValues...)...)
		cb.applyExamples(t, servers)
		for _, n := range cb.bed.Nodes {
			requireNodeCheck(t, cb, n, "CNI", func(c mptcpv1alpha1.NodeCheck) bool {
				return c.Result == mptcpv1alpha1.CheckPassed && strings.HasPrefix(c.Message, "calico ("+mode+") from /etc/cni/net.d/10-calico.conflist")
			})
		}
		requireNetworkPolicyHolds(t, cb, attached, func() {
			analysis, sent := cb.crossTransfer(t, servers)
			t.Logf("captures: %d connections, %d subflows, %d segments inside VXLAN, %d outside", len(analysis.Connections), len(analysis.Subflows), analysis.Tunneled, analysis.Plain)
			requireSpread(t, analysis, sent, "calico "+mode)
			requireTunneled(t, analysis, mode == "vxlan")
		})
	}
}

// testCilium(mode, bpfHostRouting): real nodes whose CNI is cilium-agent,
// "native" (the bed's fabrics route every pod CIDR) or "vxlan"
// (cilium_vxlan between the nodes' addresses; the fabrics route no pod
// CIDR), with legacy host routing or
// eBPF host routing (and the kube-proxy replacement it needs), its BPF
// datapath on the pods' lxc* veths and the nodes' NICs (tcx), pods'
// addresses routed to cilium_host. Cilium keeps its identity in the marks'
// upper 16 bits and its magic values in 0x0f00, so the chart is installed
// with a mark mask outside them. Every agent names its CNI
// "cilium (<mode>)"; with a Kubernetes NetworkPolicy that admits the
// servers' ingress from the client pods only, MPTCP from the clients of
// each node to the other's server spreads each connection's subflows over
// both NICs, streams whole; a connection from a server pod, which the
// policy denies, stays denied while the agent steers its subflows, and
// opens once the policy is gone. Under eBPF host routing, and only there,
// each agent counts packets it redirected at the edge; in VXLAN mode, and
// only there, outer packets it readdressed to another path.
func testCilium(mode string, bpfHostRouting bool) func(*testing.T) {
	return func(t *testing.T) {
		dir := testutil.BuiltTool(t, "CILIUM", "cilium")
		before := machineSysctls(t)
		cb := startChartBedWith(t, testbed.Config{Nodes: 2, NICs: 2, LinkRate: "100mbit", Underlay: mode == "vxlan"}, func(o *nodes.Options) {
			o.Cilium = &nodes.Cilium{Dir: dir, Mode: mode, BPFHostRouting: bpfHostRouting}
		})
		// cilium-agent writes these; the bed's nodes shadow them.
		t.Cleanup(func() {
			if after := machineSysctls(t); after != before {
				t.Errorf("the machine's kernel settings changed: before\n%s\nafter\n%s", before, after)
			}
		})
		servers := cb.tenantServers(t)
		attached := map[int]*testbed.Pod{}
		for _, n := range cb.bed.Nodes {
			p := cb.attach(t, servers[n.Index])
			if !n.PodCIDR.Contains(p.Addr) || p.HostIf != "cilium_host" {
				t.Fatalf("server pod %s behind %q: want an address of %s routed to cilium_host", p.Addr, p.HostIf, n.PodCIDR)
			}
			attached[n.Index] = p
		}
		cb.install(t, release.Chart(), cb.images, append([]string{"--set", "agent.markMask=0x0000f000"}, kubeBedValues...)...)
		cb.applyExamples(t, servers)
		for _, n := range cb.bed.Nodes {
			requireNodeCheck(t, cb, n, "CNI", func(c mptcpv1alpha1.NodeCheck) bool {
				return strings.HasPrefix(c.Message, "cilium ("+mode+") from /etc/cni/net.d/05-cilium.conflist")
			})
		}
		agents := cb.agents()
		for _, a := range agents {
			a.MetricsToken = cb.metricsReaderToken(t)
		}
		requireNetworkPolicyHolds(t, cb, attached, func() {
			analysis, sent := cb.crossTransfer(t, servers)
			t.Logf("captures: %d connections, %d subflows, %d segments inside VXLAN, %d outside", len(analysis.Connections), len(analysis.Subflows), analysis.Tunneled, analysis.Plain)
			requireSpread(t, analysis, sent, "cilium "+mode)
			requireTunneled(t, analysis, mode == "vxlan")
		})
		// Legacy host routing takes the policy routing the marks select;
		// eBPF host routing sends the pods' packets to the NIC Cilium's
		// FIB lookup picks, and the agent's nic_egress sends those of
		// subflows of the other path on.
		// What arrives into a pod crosses its host-side veth under legacy
		// host routing, where pod_ingress counts each server's bytes;
		// eBPF host routing hands it to the pod's own end past it.
		for _, a := range agents {
			m := scrape(t, a)
			steered, _ := m.Value("mptcp_agent_datapath_events_total", "event", observe.EventName(datapath.StatEdgeSteered))
			if (steered > 0) != bpfHostRouting {
				t.Errorf("node %d's agent redirected %v packets at the edge; eBPF host routing %v", a.Node.Index, steered, bpfHostRouting)
			}
			readdressed, _ := m.Value("mptcp_agent_datapath_events_total", "event", observe.EventName(datapath.StatTunnelSteered))
			if (readdressed > 0) != (mode == "vxlan") {
				t.Errorf("node %d's agent readdressed %v outer packets; mode %s", a.Node.Index, readdressed, mode)
			}
			srv := servers[a.Node.Index]
			if rx, _ := m.Value("mptcp_agent_pod_rx_bytes_total", "namespace", srv.Namespace, "pod", srv.Name); !bpfHostRouting && rx < 1<<20 {
				t.Errorf("node %d's server pod received %v bytes by the agent's count, want the transfer's (over 1 MiB)", a.Node.Index, rx)
			}
		}
	}
}

// requireNetworkPolicyHolds applies a Kubernetes NetworkPolicy that admits
// the tenant servers' ingress from the client pods only, waits until the CNI
// enforces it, runs transfer (which the policy admits) and then dials from
// the server pod of node 1, no client, to node 2's: the connection, its SYNs
// steered, must time out; once the policy is deleted it must open (each
// within cniConvergence of the policy's change).
func requireNetworkPolicyHolds(t *testing.T, cb *chartBed, attached map[int]*testbed.Pod, transfer func()) {
	t.Helper()
	policy := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "servers-from-clients", Namespace: tenantNS},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
			}},
		},
	}
	if err := cb.c.Create(background(t), policy); err != nil {
		t.Fatal(err)
	}
	// In force before the transfer: the policy admits no port from server
	// 1, so a port that nothing on server 2 listens on is refused (RST)
	// until the CNI enforces it, and times out from then on. Server 2's
	// workload sees no connection but the clients'.
	// How soon the CNI enforces a policy, or forgets a deleted one, is the
	// CNI's: on a loaded machine its agent takes seconds, so both waits
	// are long and their measure is logged.
	closed := netip.AddrPortFrom(attached[2].Addr, tenantPort+1)
	made := time.Now()
	for deadline := made.Add(cniConvergence); ; time.Sleep(200 * time.Millisecond) {
		err := dialMPTCP(attached[1], closed, 2*time.Second)
		if err == nil {
			t.Fatalf("%s: something listens on %s", attached[1], closed)
		}
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			t.Logf("NetworkPolicy enforced within %v of its creation: %v", time.Since(made).Round(time.Millisecond), err)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s to %s: %v %v after the NetworkPolicy was made: want it dropped", attached[1], closed, err, time.Since(made).Round(time.Millisecond))
		}
	}
	transfer()

	// The CNI has had the policy for the whole transfer: server 1 is no
	// client, so its connection to server 2 is dropped, its SYNs steered.
	to := netip.AddrPortFrom(attached[2].Addr, tenantPort)
	if err := dialMPTCP(attached[1], to, 3*time.Second); err == nil {
		t.Fatalf("%s reached %s through a NetworkPolicy that admits the clients only", attached[1], to)
	} else {
		t.Logf("denied by the NetworkPolicy: %v", err)
	}
	if err := cb.c.Delete(background(t), policy); err != nil {
		t.Fatal(err)
	}
	var err error
	deleted := time.Now()
	for deadline := deleted.Add(cniConvergence); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err = dialMPTCP(attached[1], to, 2*time.Second); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("%s still cannot reach %s %v after the NetworkPolicy was deleted: %v", attached[1], to, time.Since(deleted).Round(time.Millisecond), err)
	}
	t.Logf("reached %s %v after the NetworkPolicy was deleted", to, time.Since(deleted).Round(time.Millisecond))
	// What timed out before the transfer was the policy: without it the
	// closed port is refused.
	if err := dialMPTCP(attached[1], closed, 2*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("%s to %s with the NetworkPolicy gone: %v, want refused", attached[1], closed, err)
	}
}

// cniConvergence bounds how long a CNI takes to enforce a NetworkPolicy,
// or to lift a deleted one, in requireNetworkPolicyHolds.
const cniConvergence = time.Minute

// requireTunneled fails the test unless the captures on the path NICs read
// the pods' segments all inside VXLAN (inside) or all outside it.
func requireTunneled(t *testing.T, analysis *testbed.Analysis, inside bool) {
	t.Helper()
	if (analysis.Tunneled == 0) == inside || (analysis.Plain == 0) != inside {
		t.Fatalf("captures on the path NICs read %d segments of the pods inside VXLAN and %d outside: want all %s", analysis.Tunneled, analysis.Plain, map[bool]string{true: "inside", false: "outside"}[inside])
	}
}

// machineSysctls reads the machine-wide settings cilium-agent writes.
func machineSysctls(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, k := range []string{"kernel/unprivileged_bpf_disabled", "kernel/timer_migration", "net/core/bpf_jit_enable"} {
		v, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(k + "=" + string(v))
	}
	return b.String()
}

// dialMPTCP opens an MPTCP connection from pod from to to, and closes it.
func dialMPTCP(from *testbed.Pod, to netip.AddrPort, timeout time.Duration) error {
	var c net.Conn
	err := netnsutil.Do("/var/run/netns/"+from.NetNS, func() (err error) {
		d := net.Dialer{Timeout: timeout}
		d.SetMultipathTCP(true)
		c, err = d.Dial("tcp", to.String())
		return err
	})
	if err == nil {
		c.Close()
	}
	return err
}
