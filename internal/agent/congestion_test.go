package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// TestAPodGetsItsRulesCongestionControlOrIsSkipped: the agent sets a pod's
// rule's congestion control in the pod's namespace, reports it counted in
// CongestionControls, and gives the pod's own back when it releases it. A
// congestion control the node lacks (not in
// tcp_available_congestion_control), or has but does not allow in a
// namespace other than its own (not in tcp_allowed_congestion_control: the
// kernel refuses it with EPERM) and the agent cannot add to that list (its
// namespace is the bed node's, not the machine's: TestMachineWide in
// podnet has one that can), is that pod's problem: ConfigureFailed
// with what to change, and nothing of the pod's namespace changed. The
// algorithms come from this machine's lists; the one the pod gets differs
// from what its namespace inherited; the EPERM case needs one available and
// not allowed, and no other bed widening the list meanwhile.
func TestAPodGetsItsRulesCongestionControlOrIsSkipped(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 2, PodsPerNode: 3})
	node := bed.Node(1)
	set, missing, restricted := node.Pods[0], node.Pods[1], node.Pods[2]
	ns := func(p *testbed.Pod) string { return "/var/run/netns/" + p.NetNS }
	read := func(p *testbed.Pod, key string) string {
		t.Helper()
		v, err := netnsutil.ReadSysctl(ns(p), key)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// Beds of other tests widen the machine's list for their pods
	// (testbed.AllowCongestionControl); while one does, what the kernel
	// refuses cannot be known, and the EPERM case is not tried.
	release, held := testbed.HoldAllowedCongestionControls()
	defer release()
	inherited := read(set, "net.ipv4.tcp_congestion_control")
	available := strings.Fields(read(set, "net.ipv4.tcp_available_congestion_control"))
	allowed := strings.Fields(read(set, "net.ipv4.tcp_allowed_congestion_control"))
	t.Logf("pods inherit %s; available: %v; allowed in namespaces: %v", inherited, available, allowed)
	i := slices.IndexFunc(allowed, func(n string) bool { return n != inherited })
	if i < 0 {
		t.Fatalf("namespaces here may take only %v, what they inherit: no other to set", allowed)
	}
	ok := allowed[i]
	lacking := "vegas"
	for _, n := range []string{"vegas", "westwood", "htcp", "illinois", "nosuchcc"} {
		if !slices.Contains(available, n) {
			lacking = n
			break
		}
	}
	notAllowed := ""
	if i := slices.IndexFunc(available, func(n string) bool { return !slices.Contains(allowed, n) }); i >= 0 && held {
		notAllowed = available[i]
	} else {
		t.Logf("no congestion control known to be refused here (list held: %v): the EPERM case is not tried", held)
	}

	base := mptcpv1alpha1.CompiledRule{Name: "ok", Policy: "ok", SpreadMode: mptcpv1alpha1.SpreadRoundRobin,
		SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace, MaxSubflows: 2, CongestionControl: ok}
	pod := func(name, rule string, p *testbed.Pod) mptcpv1alpha1.NodePod {
		return mptcpv1alpha1.NodePod{Namespace: "apps", Name: name, UID: "u-" + name, IPs: []string{p.Addr.String()}, Rules: []string{rule}}
	}
	pods := []mptcpv1alpha1.NodePod{pod("set", "ok", set), pod("missing", "missing", missing)}
	if notAllowed != "" {
		pods = append(pods, pod("restricted", "restricted", restricted))
	}
	settings, state, links := bedNodeState(t, bed, node, base, pods...)
	for _, r := range []struct{ name, cc string }{{"missing", lacking}, {"restricted", notAllowed}} {
		rule := state.Spec.Rules[0]
		rule.Name, rule.Policy, rule.CongestionControl = r.name, r.name, r.cc
		state.Spec.Rules = append(state.Spec.Rules, rule)
	}
	locate := func(ips []netip.Addr) (LocatedPod, error) {
		for _, p := range []*testbed.Pod{set, missing, restricted} {
			if ips[0] == p.Addr {
				return LocatedPod{HostInterface: p.HostIf, NetNS: ns(p)}, nil
			}
		}
		return LocatedPod{}, fmt.Errorf("no pod at %v", ips)
	}
	pmBefore := read(missing, "net.mptcp.path_manager")
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		a, err := New(settings, slog.New(slog.DiscardHandler))
		if err != nil {
			return err
		}
		uninstalled := false
		defer func() {
			if !uninstalled {
				_ = a.Uninstall()
			}
		}()
		tr := FromNodeState(settings, state, nil, links, locate, Prior{})
		if len(tr.Errors) > 0 || len(tr.PodProblems) > 0 || len(tr.Plan.Pods) != len(pods) {
			t.Fatalf("translation: %v, %+v, %d pods", tr.Errors, tr.PodProblems, len(tr.Plan.Pods))
		}
		failed, err := a.Reconcile(context.Background(), tr.Plan)
		if err != nil {
			t.Errorf("the node's reconcile failed: %v", err)
		}
		want := map[string]string{"missing": "is not on the node (net.ipv4.tcp_available_congestion_control"}
		if notAllowed != "" {
			want["restricted"] = "is on the node but not allowed in pods' namespaces (net.ipv4.tcp_allowed_congestion_control"
		}
		for _, f := range failed {
			t.Logf("%s/%s %s: %s", f.Namespace, f.Name, f.Reason, f.Message)
			if w, ok := want[f.Name]; !ok || f.Reason != mptcpv1alpha1.PodConfigureFailed || !strings.Contains(f.Message, w) {
				t.Errorf("pod %s failed %s: %q; want ConfigureFailed saying %q", f.Name, f.Reason, f.Message, w)
			}
			delete(want, f.Name)
		}
		if len(want) > 0 {
			t.Errorf("pods not refused: %v", want)
		}
		if got := read(set, "net.ipv4.tcp_congestion_control"); got != ok {
			t.Errorf("the configured pod runs %s, want %s", got, ok)
		}
		for _, p := range []*testbed.Pod{missing, restricted} {
			if got := read(p, "net.ipv4.tcp_congestion_control"); got != inherited {
				t.Errorf("a refused pod runs %s, want what it had, %s", got, inherited)
			}
		}
		if got := read(missing, "net.mptcp.path_manager"); got != pmBefore {
			t.Errorf("a refused pod's path manager is %s, want what it had, %s", got, pmBefore)
		}
		if got, want := tr.Plan.CongestionControls(), []mptcpv1alpha1.PodCongestionControl{{Name: ok, Pods: 1}}; !slices.Equal(got, want) {
			t.Errorf("congestion controls reported %+v, want %+v", got, want)
		}
		uninstalled = true
		if err := a.Uninstall(); err != nil {
			t.Errorf("uninstall: %v", err)
		}
		if got := read(set, "net.ipv4.tcp_congestion_control"); got != inherited {
			t.Errorf("after uninstall the pod runs %s, want its own back, %s", got, inherited)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
