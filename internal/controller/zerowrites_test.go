package controller_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/nodestate"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// writeResources are the resources the controller writes: its own kinds and
// their status, Node annotations and events. Writes are counted by the API
// server (apiserver_request_total), so a write from any client counts.
var writeResources = []string{
	"mptcp.io/mptcpnodestates", "mptcp.io/mptcpnodestates/status",
	"mptcp.io/mptcppolicies", "mptcp.io/mptcppolicies/status",
	"mptcp.io/mptcppaths", "mptcp.io/mptcppaths/status", "mptcp.io/mptcppeers",
	"/nodes", "events.k8s.io/events", "/events",
}

// TestUnchangedInputsMakeNoWrites converges a small cluster, then makes the
// controller reconcile everything again twice, once from a cold start of a
// new controller and once because of a change that does not matter to any
// spec, and checks at the API server that neither wrote anything.
func TestUnchangedInputsMakeNoWrites(t *testing.T) {
	env := testenv.Start(t)
	mgr := testenv.StartManager(t, env)
	f := newFixture(t, env, 0)

	twoFabrics(f)
	f.namespace("tenant-b", enabled)
	f.path("lte", "wwan0", multipath, mptcpv1alpha1.PathRoleBackup)
	f.policy("spread", 0, enabled, nil, []string{"fabric-a=2", "fabric-b"}, allowPreferences)
	f.policy("storage", 10, enabled, map[string]string{"app": "db"}, []string{"fabric-a"}, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
		s.HeaderRewriting = mptcpv1alpha1.Allowed
		s.BackupPaths = []string{f.n("lte")}
	})
	want := map[string][]string{"n1": nil, "n2": nil}
	for i := range 6 {
		node := []string{"n1", "n2"}[i%2]
		ns := []string{"tenant-a", "tenant-b"}[i%2]
		ip := fmt.Sprintf("10.1.%d.%d", i%2+1, 10+i)
		labels := map[string]string{"app": []string{"web", "db", "web"}[i%3]}
		var ann map[string]string
		if i == 5 { // a refused preference: its event must not repeat either
			ann = map[string]string{mptcpv1alpha1.AnnotationPreferredPaths: f.n("lte")}
		}
		f.pod(ns, fmt.Sprintf("pod-%d", i), node, ip, labels, ann)
		rules := "spread[fabric-a/2,fabric-b/1]"
		if labels["app"] == "db" {
			rules = "storage[fabric-a/1|backup:lte]; " + rules
		}
		want[node] = append(want[node], fmt.Sprintf("%s/pod-%d %s: %s", ns, i, ip, rules))
	}
	f.expectNodes(want)
	f.report("n1", mptcpv1alpha1.PathState{Name: "fabric-a", Link: mptcpv1alpha1.LinkUp, Addresses: []string{"192.0.2.1"}})
	f.applyAll("n2")
	f.expectEvent("tenant-b", "pod-5", "PreferredPathsOutsidePolicy")
	testenv.WaitIdle(t, time.Second, 30*time.Second)

	parent := t
	t.Run("a restarted controller", func(t *testing.T) {
		before := env.CountWrites(t)
		reconciles := testenv.Reconciles(t, nodestate.ControllerName)
		mgr.Stop()
		testenv.StartManager(parent, env) // keeps running for the next subtest
		testenv.WaitIdle(t, 2*time.Second, 30*time.Second)
		if n := testenv.Reconciles(t, nodestate.ControllerName) - reconciles; n < 2 {
			t.Fatalf("the new controller reconciled %v nodes, want both", n)
		}
		if d := env.CountWrites(t).Sub(before); d.Total(writeResources...) != 0 {
			t.Fatalf("a restarted controller wrote with nothing changed: %v", d)
		}
	})
	t.Run("a change no spec depends on", func(t *testing.T) {
		before := env.CountWrites(t)
		reconciles := testenv.Reconciles(t, nodestate.ControllerName)
		// Namespace label changes make every node recompile.
		f.labelNamespace("tenant-b", map[string]string{"tenant": "enabled", "unrelated": "x"})
		testenv.WaitIdle(t, 2*time.Second, 30*time.Second)
		if n := testenv.Reconciles(t, nodestate.ControllerName) - reconciles; n < 2 {
			t.Fatalf("the change made %v node reconciles, want at least 2", n)
		}
		d := env.CountWrites(t).Sub(before)
		if d.Total("/namespaces") != 1 {
			t.Fatalf("the test's own namespace update was not counted: the count is blind (%v)", d)
		}
		if d.Total(writeResources...) != 0 {
			t.Fatalf("reconciling unchanged inputs wrote: %v", d)
		}
	})
}

// TestJoiningNodeTouchesNoOtherNodeState: a node that joins and publishes its
// per-path addresses costs a bounded number of writes, none of them to other
// nodes' states, so publishing peers is O(nodes) writes in all, not
// O(nodes^2), and no node state grows with the cluster.
func TestJoiningNodeTouchesNoOtherNodeState(t *testing.T) {
	env := testenv.Start(t)
	testenv.StartManager(t, env)
	f := newFixture(t, env, 0)
	twoFabrics(f)
	f.policy("spread", 0, enabled, nil, []string{"fabric-a", "fabric-b"}, nil)
	f.pod("tenant-a", "web", "n1", "10.1.1.10", nil, nil)
	f.report("n1", mptcpv1alpha1.PathState{Name: "fabric-a", Link: mptcpv1alpha1.LinkUp, Addresses: []string{"192.0.2.1"}})
	f.report("n2", mptcpv1alpha1.PathState{Name: "fabric-a", Link: mptcpv1alpha1.LinkUp, Addresses: []string{"192.0.2.2"}})
	f.expectNodes(map[string][]string{"n1": {"tenant-a/web 10.1.1.10: spread[fabric-a/1,fabric-b/1]"}, "n2": {}})
	testenv.WaitIdle(t, time.Second, 30*time.Second)

	versions := func() map[string]string {
		var states mptcpv1alpha1.MPTCPNodeStateList
		f.must(f.c.List(f.ctx, &states), "list node states")
		out := map[string]string{}
		for _, s := range states.Items {
			out[s.Name] = s.ResourceVersion
		}
		return out
	}
	sizeOf := func(node string) int {
		var s mptcpv1alpha1.MPTCPNodeState
		f.must(f.c.Get(f.ctx, types.NamespacedName{Name: f.n(node)}, &s), "get node state")
		s.ManagedFields = nil
		b, _ := json.Marshal(s.Spec)
		return len(b)
	}
	rvBefore, sizeBefore := versions(), sizeOf("n1")
	before := env.CountWrites(t)

	for i := 3; i <= 6; i++ {
		node := fmt.Sprintf("n%d", i)
		f.node(node, multipath, fmt.Sprintf("10.1.%d.0/24", i))
		f.report(node, mptcpv1alpha1.PathState{Name: "fabric-a", Link: mptcpv1alpha1.LinkUp, Addresses: []string{fmt.Sprintf("192.0.2.%d", i)}})
	}
	testenv.WaitIdle(t, time.Second, 30*time.Second)

	after := versions()
	for name, rv := range rvBefore {
		if after[name] != rv {
			t.Errorf("node state %s was written when other nodes joined", name)
		}
	}
	if got := sizeOf("n1"); got != sizeBefore {
		t.Errorf("node state n1 went from %d to %d bytes when nodes joined", sizeBefore, got)
	}
	d := env.CountWrites(t).Sub(before)
	// Per joining node: the node state's create (the controller), its
	// status (the test, as agent) and the Node's creation (the test): the
	// controller writes no Node (nothing reads a peer's addresses from it).
	if n := d.Total("/nodes"); n != 4 {
		t.Errorf("Node writes for 4 joining nodes: %v, want 4 (their creation, nothing from the controller): %v", n, d)
	}
	// Per joining node, its own state is written three times: created,
	// its status (the agent's addresses), and its spec giving it those
	// addresses (spec.paths[].addresses, which keep an address with the
	// node that reported it first).
	if n := d.Total("mptcp.io/mptcpnodestates", "mptcp.io/mptcpnodestates/status"); n != 12 {
		t.Errorf("node state writes for 4 joining nodes: %v, want 12 (create, agent status, addresses given, each): %v", n, d)
	}
	// Without pods they are no peers: n1's MPTCPPeer, the one there is,
	// stays as it was.
	if n := d.Total("mptcp.io/mptcppeers"); n != 0 {
		t.Errorf("MPTCPPeer writes for 4 joining nodes without pods: %v, want none: %v", n, d)
	}
}
