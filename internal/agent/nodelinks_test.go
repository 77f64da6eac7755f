package agent_test

import (
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/routing"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// On a real node namespace of the test bed: paths resolve to the NICs by
// name, altname and pattern, each NIC's gateway is the fabric address (from
// the default route on nic1, from the subnet on nic2, which has none), and a
// pod is found from its address alone: its host-side veth and its named
// namespace.
func TestNodeLinksAndPodsAreFoundInARealNamespace(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 2, PodsPerNode: 2})
	node := bed.Node(1)
	if out, err := bed.Command(node.NetNS, "ip", "link", "property", "add", "dev", "nic2", "altname", "fabricb0").CombinedOutput(); err != nil {
		t.Fatalf("altname: %v: %s", err, out)
	}
	var links []agent.NodeLink
	located := map[string]agent.LocatedPod{}
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		var err error
		if links, err = agent.Links(); err != nil {
			return err
		}
		for _, p := range node.Pods {
			loc, err := agent.LocatePod([]netip.Addr{p.Addr})
			if err != nil {
				return err
			}
			located[p.Name] = loc
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range node.Pods {
		want := agent.LocatedPod{HostInterface: p.HostIf, NetNS: "/var/run/netns/" + p.NetNS}
		if located[p.Name] != want {
			t.Errorf("pod %s located at %+v, want %+v", p.Name, located[p.Name], want)
		}
	}

	state := &mptcpv1alpha1.MPTCPNodeState{Spec: mptcpv1alpha1.MPTCPNodeStateSpec{Paths: []mptcpv1alpha1.NodePath{
		{Name: "a", Index: 1, Interface: mptcpv1alpha1.InterfaceSelector{Name: "nic1"}},
		{Name: "b", Index: 2, Interface: mptcpv1alpha1.InterfaceSelector{AltName: "fabricb0"}},
		{Name: "any", Index: 3, Interface: mptcpv1alpha1.InterfaceSelector{Pattern: "nic*"}},
	}}}
	state.Name = "n1"
	// An address beyond a NIC (a veth in the bed, with a peer namespace
	// of its own) is no pod.
	state.Spec.Rules = []mptcpv1alpha1.CompiledRule{{Name: "p-1", Policy: "p", Paths: []mptcpv1alpha1.RulePath{{Name: "a"}}}}
	state.Spec.Pods = []mptcpv1alpha1.NodePod{{Namespace: "apps", Name: "far", IPs: []string{node.NICs[0].Gateway.String()}, Rules: []string{"p-1"}}}
	var tr *agent.Translation
	if err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		tr = agent.FromNodeState(agent.NodeDefaults("n1"), state, nil, links, agent.LocatePod, agent.Prior{})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []agent.PlanPath{
		{Path: routing.Path{Name: "a", Index: 1, Interface: "nic1", Gateway: node.NICs[0].Gateway}},
		{Path: routing.Path{Name: "b", Index: 2, Interface: "nic2", Gateway: node.NICs[1].Gateway}},
	}
	if !slices.Equal(tr.Plan.Paths, want) {
		t.Errorf("paths %+v, want %+v", tr.Plan.Paths, want)
	}
	states := map[string]mptcpv1alpha1.PathState{}
	for _, p := range tr.Paths {
		states[p.Name] = p
	}
	for i, name := range []string{"a", "b"} {
		if p := states[name]; p.Link != mptcpv1alpha1.LinkUp || !slices.Equal(p.Addresses, []string{node.NICs[i].Addr.Addr().String()}) {
			t.Errorf("path %s: %+v", name, p)
		}
	}
	// The pod's problem, not the node's.
	if len(tr.Plan.Pods) != 0 || len(tr.Errors) != 0 || !slices.ContainsFunc(tr.PodProblems, func(p mptcpv1alpha1.PodProblem) bool {
		return p.Name == "far" && p.Reason == mptcpv1alpha1.PodAddressOnPath &&
			p.Message == "its address "+node.NICs[0].Gateway.String()+" leads out of path a (nic1), not to a local pod"
	}) {
		t.Errorf("pods %+v, errors %q, pod problems %+v", tr.Plan.Pods, tr.Errors, tr.PodProblems)
	}
	if states["any"].Link != mptcpv1alpha1.LinkAmbiguous {
		t.Errorf("pattern nic* over two NICs: %+v", states["any"])
	}
}

// locPod is a pod namespace of a test node: its host-side interface and
// its address.
type locPod struct {
	ns     string
	hostIf string
	addr   netip.Addr
}

func (p locPod) want() agent.LocatedPod {
	return agent.LocatedPod{HostInterface: p.hostIf, NetNS: "/var/run/netns/" + p.ns}
}

func ipIn(t *testing.T, ns string, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		args := append([]string{"-n", ns}, strings.Fields(c)...)
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
}

// locNode creates a node namespace with n pods, laid out as a bridge CNI
// (flannel's cni0, the `bridge` plugin) does when bridged: bridge cni0
// holds the pods' gateway 10.244.1.1/24, each pod's host veth is a port
// of it. Otherwise as the `ptp` plugin does: a routed veth per pod, the
// gateway on each, a /32 route to the pod through it. Either way the pod's
// eth0 holds 10.244.1.(10+i)/24. Everything lives in namespaces the test
// creates and deletes.
func locNode(t *testing.T, bridged bool, n int) (node string, pods []locPod) {
	t.Helper()
	node = testutil.NetNS(t, "loc-node-")
	ipIn(t, node, "link set lo up")
	if bridged {
		ipIn(t, node, "link add cni0 type bridge", "addr add 10.244.1.1/24 dev cni0", "link set cni0 up")
	}
	for i := range n {
		p := locPod{ns: testutil.NetNS(t, "loc-pod-"), hostIf: fmt.Sprintf("veth%d", i), addr: netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)})}
		ipIn(t, node, fmt.Sprintf("link add %s type veth peer name eth0 netns %s", p.hostIf, p.ns))
		if bridged {
			ipIn(t, node, fmt.Sprintf("link set %s master cni0", p.hostIf))
		} else {
			ipIn(t, node, fmt.Sprintf("addr add 10.244.1.1/32 dev %s", p.hostIf))
		}
		ipIn(t, node, fmt.Sprintf("link set %s up", p.hostIf))
		if !bridged {
			ipIn(t, node, fmt.Sprintf("route add %s/32 dev %s", p.addr, p.hostIf))
		}
		ipIn(t, p.ns, "link set lo up", fmt.Sprintf("addr add %s/24 dev eth0", p.addr), "link set eth0 up")
		pods = append(pods, p)
	}
	return node, pods
}

// locate runs LocatePod in the node's namespace, as the agent runs it in
// its own.
func locate(t *testing.T, node string, addr netip.Addr) (agent.LocatedPod, error) {
	t.Helper()
	var loc agent.LocatedPod
	var lerr error
	if err := netnsutil.Do("/var/run/netns/"+node, func() error {
		loc, lerr = agent.LocatePod([]netip.Addr{addr})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return loc, lerr
}

// Routed veths: the route, which the CNI wrote, names the pod. Another
// pod that puts the same address on its own eth0 changes nothing, and a
// pod whose namespace holds no address (a VM's bridge binding gives it to
// the guest) is found all the same.
func TestLocatePodOnRoutedVeths(t *testing.T) {
	node, pods := locNode(t, false, 3)
	victim, attacker, vm := pods[0], pods[1], pods[2]
	ipIn(t, attacker.ns, fmt.Sprintf("addr add %s/24 dev eth0", victim.addr))
	ipIn(t, vm.ns, "addr flush dev eth0")
	for _, p := range pods {
		if loc, err := locate(t, node, p.addr); err != nil || loc != p.want() {
			t.Errorf("%s: located at %+v, %v; want %+v", p.addr, loc, err, p.want())
		}
	}
}

// A bridge CNI: the route to every pod leads to cni0; each pod is found
// at its own port, from the namespace that holds its address.
func TestLocatePodBehindABridge(t *testing.T) {
	node, pods := locNode(t, true, 3)
	for range 2 { // the second round from the snapshot the first took
		for _, p := range pods {
			if loc, err := locate(t, node, p.addr); err != nil || loc != p.want() {
				t.Errorf("%s: located at %+v, %v; want %+v", p.addr, loc, err, p.want())
			}
		}
	}
	// A pod set up since is found at once, not after the snapshot ages.
	late := locPod{ns: testutil.NetNS(t, "loc-pod-"), hostIf: "veth9", addr: netip.MustParseAddr("10.244.1.19")}
	ipIn(t, node, "link add veth9 type veth peer name eth0 netns "+late.ns, "link set veth9 master cni0", "link set veth9 up")
	ipIn(t, late.ns, "addr add 10.244.1.19/24 dev eth0", "link set eth0 up")
	time.Sleep(150 * time.Millisecond) // beyond the snapshot's minimum age
	if loc, err := locate(t, node, late.addr); err != nil || loc != late.want() {
		t.Errorf("%s: located at %+v, %v; want %+v", late.addr, loc, err, late.want())
	}
}

// Behind a bridge, a tenant can put another pod's address on its own
// eth0: two namespaces then claim it, and neither is taken. The victim is
// reported for itself, with the reason; the node's other pods are
// configured. A claim no other namespace contests is taken, even where the
// pod's own namespace holds no address (a VM whose guest holds it); the
// pods then found at one interface are refused together, so that neither
// gets the other's rules. The bridge's neighbour entries and forwarding
// database, which any pod with CAP_NET_RAW writes, decide nothing.
func TestLocatePodRefusesAnAddressClaimedTwice(t *testing.T) {
	node, pods := locNode(t, true, 4)
	victim, attacker, bystander, vm := pods[0], pods[1], pods[2], pods[3]
	ipIn(t, attacker.ns, fmt.Sprintf("addr add %s/24 dev eth0", victim.addr))

	_, err := locate(t, node, victim.addr)
	if err == nil || !strings.Contains(err.Error(), "held by the namespaces behind veth0, veth1: more than one claims it") {
		t.Errorf("victim: %v, want a refusal naming veth0 and veth1", err)
	}
	if loc, err := locate(t, node, bystander.addr); err != nil || loc != bystander.want() {
		t.Errorf("bystander: located at %+v, %v; want %+v", loc, err, bystander.want())
	}

	state := &mptcpv1alpha1.MPTCPNodeState{Spec: mptcpv1alpha1.MPTCPNodeStateSpec{
		PodCIDRs: []string{"10.244.1.0/24"},
		Paths:    []mptcpv1alpha1.NodePath{{Name: "a", Index: 1, Interface: mptcpv1alpha1.InterfaceSelector{Name: "nic1"}}},
		Rules:    []mptcpv1alpha1.CompiledRule{{Name: "p-1", Policy: "p", Paths: []mptcpv1alpha1.RulePath{{Name: "a"}}}},
		Pods: []mptcpv1alpha1.NodePod{
			{Namespace: "tenant-a", Name: "victim", IPs: []string{victim.addr.String()}, Rules: []string{"p-1"}},
			{Namespace: "tenant-c", Name: "bystander", IPs: []string{bystander.addr.String()}, Rules: []string{"p-1"}},
		},
	}}
	state.Name = "n1"
	links := []agent.NodeLink{{Name: "nic1", Up: true, Addresses: []netip.Prefix{netip.MustParsePrefix("10.101.1.2/24")}, Gateway: netip.MustParseAddr("10.101.1.1")}}
	var tr *agent.Translation
	if err := netnsutil.Do("/var/run/netns/"+node, func() error {
		tr = agent.FromNodeState(agent.NodeDefaults("n1"), state, nil, links, agent.LocatePod, agent.Prior{})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(tr.Errors) != 0 || len(tr.Plan.Pods) != 1 || tr.Plan.Pods[0].HostInterface != bystander.hostIf ||
		len(tr.PodProblems) != 1 || tr.PodProblems[0].Name != "victim" || tr.PodProblems[0].Reason != mptcpv1alpha1.PodNotFound ||
		!strings.Contains(tr.PodProblems[0].Message, "more than one claims it") {
		t.Errorf("errors %q, pods %+v, pod problems %+v: want the victim NotFound for the double claim, the bystander configured", tr.Errors, tr.Plan.Pods, tr.PodProblems)
	}

	// The VM's namespace holds no address; the attacker claims it alone
	// and poisons the bridge's entries towards the VM's port.
	ipIn(t, vm.ns, "addr flush dev eth0")
	ipIn(t, attacker.ns, fmt.Sprintf("addr add %s/24 dev eth0", vm.addr))
	const guestMAC = "02:00:00:00:00:42"
	ipIn(t, node, fmt.Sprintf("neigh add %s lladdr %s dev cni0 nud permanent", vm.addr, guestMAC))
	if out, err := exec.Command("ip", "netns", "exec", node, "bridge", "fdb", "add", guestMAC, "dev", vm.hostIf, "master", "static").CombinedOutput(); err != nil {
		t.Fatalf("bridge fdb add: %v: %s", err, out)
	}
	if loc, err := locate(t, node, vm.addr); err != nil || loc.HostInterface != attacker.hostIf {
		t.Errorf("vm: located at %+v, %v; want the only claim, the attacker's %s", loc, err, attacker.hostIf)
	}
	state.Spec.Pods = []mptcpv1alpha1.NodePod{
		{Namespace: "tenant-b", Name: "attacker", IPs: []string{attacker.addr.String()}, Rules: []string{"p-1"}},
		{Namespace: "tenant-c", Name: "bystander", IPs: []string{bystander.addr.String()}, Rules: []string{"p-1"}},
		{Namespace: "tenant-d", Name: "vm", IPs: []string{vm.addr.String()}, Rules: []string{"p-1"}},
	}
	if err := netnsutil.Do("/var/run/netns/"+node, func() error {
		tr = agent.FromNodeState(agent.NodeDefaults("n1"), state, nil, links, agent.LocatePod, agent.Prior{})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var refused []string
	for _, p := range tr.PodProblems {
		if p.Reason == mptcpv1alpha1.PodNotFound && strings.Contains(p.Message, "2 pods are found") {
			refused = append(refused, p.Name)
		}
	}
	if len(tr.Plan.Pods) != 1 || tr.Plan.Pods[0].HostInterface != bystander.hostIf || !slices.Equal(refused, []string{"attacker", "vm"}) {
		t.Errorf("pods %+v, pod problems %+v: want the attacker and the vm refused for sharing %s, the bystander configured", tr.Plan.Pods, tr.PodProblems, attacker.hostIf)
	}
}

// A pod whose namespace is gone is not found, with the reason, whether its
// veth was routed or a bridge port, and even just after it was found
// (nothing stale is returned).
func TestLocatePodWhoseNamespaceIsGone(t *testing.T) {
	for _, bridged := range []bool{false, true} {
		t.Run(map[bool]string{false: "routed", true: "bridged"}[bridged], func(t *testing.T) {
			node, pods := locNode(t, bridged, 2)
			gone, other := pods[0], pods[1]
			if loc, err := locate(t, node, gone.addr); err != nil || loc != gone.want() {
				t.Fatalf("before: located at %+v, %v; want %+v", loc, err, gone.want())
			}
			if out, err := exec.Command("ip", "netns", "del", gone.ns).CombinedOutput(); err != nil {
				t.Fatalf("ip netns del: %v: %s", err, out)
			}
			// The kernel tears a namespace down asynchronously; its veth
			// goes with it.
			deadline := time.Now().Add(5 * time.Second)
			for exec.Command("ip", "-n", node, "link", "show", gone.hostIf).Run() == nil {
				if time.Now().After(deadline) {
					t.Fatalf("%s still there 5 s after its namespace was deleted", gone.hostIf)
				}
				time.Sleep(20 * time.Millisecond)
			}
			loc, err := locate(t, node, gone.addr)
			if err == nil || !strings.Contains(err.Error(), "no network namespace holds "+gone.addr.String()) {
				t.Errorf("after: located at %+v, %v; want no namespace holding it", loc, err)
			}
			if loc, err := locate(t, node, other.addr); err != nil || loc != other.want() {
				t.Errorf("other pod: located at %+v, %v; want %+v", loc, err, other.want())
			}
		})
	}
}
