package agent

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/api/resource"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/shaping"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// TestAPodAddedFirstMovesNoOtherPodsShapingClass: a pod's HTB class on a
// path's NIC, and the datapath's entry that sends the pod's packets to it,
// are the pod's own. A tenant's new pod whose name sorts first gets a class
// of its own, and every other pod keeps its class (the same handle: its
// queue and its rate) and its entry; so it does when that pod goes again.
func TestAPodAddedFirstMovesNoOtherPodsShapingClass(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 1, PodsPerNode: 3})
	node := bed.Node(1)
	perPod := resource.MustParse("10M")
	rule := mptcpv1alpha1.CompiledRule{Name: "r", Policy: "p", SpreadMode: mptcpv1alpha1.SpreadRoundRobin,
		SubflowCreation: mptcpv1alpha1.SubflowCreationSignal, MaxSubflows: 2,
		RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModeShape, PerPod: &perPod}}
	pod := func(ns, name string, p *testbed.Pod) mptcpv1alpha1.NodePod {
		return mptcpv1alpha1.NodePod{Namespace: ns, Name: name, UID: "u-" + name, IPs: []string{p.Addr.String()}, Rules: []string{"r"}}
	}
	web, db, first := node.Pods[0], node.Pods[1], node.Pods[2]
	settings, state, links := bedNodeState(t, bed, node, rule)
	locate := bedLocate(node)
	err := inAgent(t, node, settings, func(a *Agent) error {
		// classes maps each pod to its entry's class, and each class of
		// the NIC to its rate.
		classes := func(step string, pods ...mptcpv1alpha1.NodePod) (map[netip.Addr]uint32, map[uint32]uint64) {
			t.Helper()
			state.Spec.Pods = pods
			tr := FromNodeState(settings, state, nil, links, locate, Prior{})
			if len(tr.Errors) > 0 || len(tr.PodProblems) > 0 || len(tr.Plan.Pods) != len(pods) {
				t.Fatalf("%s: translation: %v, %+v, %d pods", step, tr.Errors, tr.PodProblems, len(tr.Plan.Pods))
			}
			if failed, err := a.Reconcile(context.Background(), tr.Plan); err != nil || len(failed) > 0 {
				t.Fatalf("%s: reconcile: %v, %+v", step, err, failed)
			}
			entries, err := a.dp.ShapeClasses()
			if err != nil {
				t.Fatal(err)
			}
			byPod := map[netip.Addr]uint32{}
			for _, e := range entries {
				if e.Pod.IsValid() {
					byPod[e.Pod] = e.ClassID
				}
			}
			// A pod's classes are on the shaping device, for all its
			// paths.
			link, err := netlink.LinkByName(shaping.DeviceName)
			if err != nil {
				t.Fatal(err)
			}
			list, err := netlink.ClassList(link, netlink.MakeHandle(0x6d70, 0))
			if err != nil {
				t.Fatal(err)
			}
			rates := map[uint32]uint64{}
			for _, c := range list {
				if htb, ok := c.(*netlink.HtbClass); ok {
					rates[c.Attrs().Handle] = htb.Rate
				}
			}
			for addr, class := range byPod {
				if _, ok := rates[class]; !ok {
					t.Errorf("%s: pod %v's entry sends to class %s, which %s lacks", step, addr, netlink.HandleStr(class), shaping.DeviceName)
				}
			}
			if len(byPod) != len(pods) {
				t.Errorf("%s: entries for %d pods, want %d: %v", step, len(byPod), len(pods), byPod)
			}
			return byPod, rates
		}
		keep := func(step string, before map[netip.Addr]uint32, beforeRates map[uint32]uint64, after map[netip.Addr]uint32, afterRates map[uint32]uint64) {
			t.Helper()
			for _, p := range []*testbed.Pod{web, db} {
				if c := before[p.Addr]; after[p.Addr] != c || afterRates[c] != beforeRates[c] {
					t.Errorf("%s: pod %v's class moved from %s (%d B/s) to %s (%d B/s)", step, p.Addr,
						netlink.HandleStr(c), beforeRates[c], netlink.HandleStr(after[p.Addr]), afterRates[after[p.Addr]])
				}
			}
		}
		before, beforeRates := classes("web and db", pod("tenant-b", "web", web), pod("tenant-c", "db", db))
		if before[web.Addr] == before[db.Addr] {
			t.Fatalf("web and db share class %s", netlink.HandleStr(before[web.Addr]))
		}
		withFirst, withFirstRates := classes("a pod that sorts first", pod("tenant-a", "first", first), pod("tenant-b", "web", web), pod("tenant-c", "db", db))
		keep("a pod that sorts first", before, beforeRates, withFirst, withFirstRates)
		for _, p := range []*testbed.Pod{web, db} {
			if withFirst[first.Addr] == withFirst[p.Addr] {
				t.Errorf("the new pod shares %v's class %s", p.Addr, netlink.HandleStr(withFirst[p.Addr]))
			}
		}
		after, afterRates := classes("that pod gone", pod("tenant-b", "web", web), pod("tenant-c", "db", db))
		keep("that pod gone", before, beforeRates, after, afterRates)
		if !maps.Equal(afterRates, beforeRates) {
			t.Errorf("classes after the new pod went %v, want those before it came %v", afterRates, beforeRates)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestNoShapingDeviceIsReported: without the node's shaping device (an ifb
// the kernel cannot make when its module is missing; here a link of another
// kind holds its name, which the agent never takes over) no pod's class is
// anywhere. The reconcile says so, for the node's Degraded condition, rather
// than leaving every pod's shape cap off unsaid; the pods are still
// configured, and the link is left alone.
func TestNoShapingDeviceIsReported(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 1, PodsPerNode: 1})
	node := bed.Node(1)
	perPod := resource.MustParse("10M")
	rule := mptcpv1alpha1.CompiledRule{Name: "r", Policy: "p", SpreadMode: mptcpv1alpha1.SpreadRoundRobin,
		SubflowCreation: mptcpv1alpha1.SubflowCreationSignal, MaxSubflows: 2,
		RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModeShape, PerPod: &perPod}}
	web := node.Pods[0]
	settings, state, links := bedNodeState(t, bed, node, rule)
	state.Spec.Pods = []mptcpv1alpha1.NodePod{{Namespace: "tenant", Name: "web", UID: "u-web", IPs: []string{web.Addr.String()}, Rules: []string{"r"}}}
	locate := func(ips []netip.Addr) (LocatedPod, error) {
		if ips[0] != web.Addr {
			return LocatedPod{}, fmt.Errorf("no pod at %v", ips)
		}
		return LocatedPod{HostInterface: web.HostIf, NetNS: "/var/run/netns/" + web.NetNS}, nil
	}
	testbed.Must(t, netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: shaping.DeviceName}, PeerName: "not-shaping"})
	}))
	err := inAgent(t, node, settings, func(a *Agent) error {
		tr := FromNodeState(settings, state, nil, links, locate, Prior{})
		if len(tr.Errors) > 0 || len(tr.Plan.Pods) != 1 {
			t.Fatalf("translation: %v, %d pods", tr.Errors, len(tr.Plan.Pods))
		}
		failed, err := a.Reconcile(context.Background(), tr.Plan)
		if len(failed) > 0 {
			t.Errorf("pods failed %+v, want the pod configured", failed)
		}
		if err == nil || !strings.Contains(err.Error(), "shaping device") || !strings.Contains(err.Error(), "perPod and perNamespace shape caps do not hold") {
			t.Errorf("reconcile error %v, want the missing shaping device and the caps it leaves off reported", err)
		}
		entries, err := a.dp.ShapeClasses()
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.Pod.IsValid() {
				t.Errorf("entry %+v sends a pod to a class on no device", e)
			}
		}
		if link, err := netlink.LinkByName(shaping.DeviceName); err != nil || link.Type() != "veth" {
			t.Errorf("the link named %s: %v, %v, want the veth left in place", shaping.DeviceName, link, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
