package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/nodecheck"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// A CNI is checked at every reconcile, not only when the agent starts: one
// installed after the agent (Cilium here, which may route pods' packets in
// BPF) gets nic_egress on every path NIC; encryption
// turned on later (Cilium's WireGuard device, every mark bit) stops the
// datapath's marks (observe-only), withdraws the paths' fwmark rules and
// refuses the reconcile with ErrMarkClash, the Marks check failed; turned
// off, enforced again once confirmed. What relaxes the last check (the CNI
// found, the clash over) waits for a second check the confirmation span
// after the first.
func TestACNIThatChangesWhileTheAgentRunsIsSeenWithoutARestart(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 2, PodsPerNode: 1})
	node := bed.Node(1)
	settings, state, links := bedNodeState(t, bed, node, mptcpv1alpha1.CompiledRule{Name: "r", Policy: "p",
		SpreadMode: mptcpv1alpha1.SpreadRoundRobin, MaxSubflows: 2},
		mptcpv1alpha1.NodePod{Namespace: "tenant-a", Name: "web", UID: "u-web", IPs: []string{node.Pods[0].Addr.String()}, Rules: []string{"r"}})
	settings.CNIConfDir, settings.MarkMask = t.TempDir(), 0x0000f000 // Cilium's bits left to the agent
	locate := bedLocate(node)
	err := inAgent(t, node, settings, func(a *Agent) error {
		a.confirmSpan = 300 * time.Millisecond
		reconcile := func(step string) error {
			tr := FromNodeState(settings, state, nil, links, locate, Prior{})
			if len(tr.Errors) > 0 || len(tr.PodProblems) > 0 {
				t.Fatalf("%s: translation: %v, %+v", step, tr.Errors, tr.PodProblems)
			}
			_, err := a.Reconcile(context.Background(), tr.Plan)
			return err
		}
		edgeHooks := func() int {
			atts, err := a.Attachments()
			if err != nil {
				t.Fatal(err)
			}
			return len(slices.DeleteFunc(atts, func(at datapath.Attachment) bool { return at.Hook != datapath.HookNICEgress }))
		}
		check := func(name string) mptcpv1alpha1.NodeCheck {
			i := slices.IndexFunc(a.Checks(), func(c mptcpv1alpha1.NodeCheck) bool { return c.Name == name })
			if i < 0 {
				t.Fatalf("no %s check in %+v", name, a.Checks())
			}
			return a.Checks()[i]
		}
		observeOnly := func() bool {
			on, err := a.dp.ObserveOnly()
			if err != nil {
				t.Fatal(err)
			}
			return on
		}

		if err := reconcile("no CNI configuration"); err != nil {
			t.Fatalf("no CNI configuration: %v", err)
		}
		if n := edgeHooks(); n != 0 {
			t.Errorf("no CNI configuration: nic_egress on %d NICs, want none", n)
		}

		conf := `{"name":"cilium","cniVersion":"0.3.1","plugins":[{"type":"cilium-cni"}]}`
		if err := os.WriteFile(filepath.Join(settings.CNIConfDir, "05-cilium.conflist"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		// A change that relaxes the last check stands once confirmed:
		// two checks at least the confirmation span apart.
		for _, step := range []string{"Cilium installed, first check", "Cilium installed, second check at once"} {
			if err := reconcile(step); err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			if n := edgeHooks(); n != 0 {
				t.Errorf("%s: nic_egress on %d NICs, want none yet", step, n)
			}
		}
		time.Sleep(a.confirmSpan)
		if err := reconcile("Cilium installed"); err != nil {
			t.Fatalf("Cilium installed: %v", err)
		}
		if n := edgeHooks(); n != len(node.NICs) {
			t.Errorf("Cilium installed: nic_egress on %d NICs, want every path's (%d)", n, len(node.NICs))
		}
		if c := check(nodecheck.Marks); c.Result != mptcpv1alpha1.CheckPassed {
			t.Errorf("Cilium installed: Marks check %+v, want passed", c)
		}

		// Only its name tells the agent (a veth: this kernel has no
		// dummy or WireGuard devices to spare).
		wg := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cilium_wg0"}, PeerName: "cilium_wg0p"}
		if err := netlink.LinkAdd(wg); err != nil {
			return err
		}
		if err := reconcile("WireGuard on"); !errors.Is(err, ErrMarkClash) {
			t.Errorf("WireGuard on: reconcile %v, want a mark clash", err)
		}
		if c := check(nodecheck.Marks); c.Result != mptcpv1alpha1.CheckFailed || c.Reason != mptcpv1alpha1.ReasonMarkClash {
			t.Errorf("WireGuard on: Marks check %+v, want failed, MarkClash", c)
		}
		if !observeOnly() {
			t.Error("WireGuard on: the datapath still marks packets, want observe-only")
		}
		if n := markRules(t); n != 0 {
			t.Errorf("WireGuard on: %d fwmark rules left, want none (they would route by the CNI's bits)", n)
		}

		if err := netlink.LinkDel(wg); err != nil {
			return err
		}
		// One check without the clash is not yet its end (a check can
		// miss what the CNI is rewriting), nor a second at once; one
		// after the confirmation span is.
		for _, step := range []string{"WireGuard off, first check", "WireGuard off, second check at once"} {
			if err := reconcile(step); !errors.Is(err, ErrMarkClash) || markRules(t) != 0 || !observeOnly() {
				t.Errorf("%s: reconcile %v, %d fwmark rules, observe-only %v; want the clash held",
					step, err, markRules(t), observeOnly())
			}
		}
		time.Sleep(a.confirmSpan)
		if err := reconcile("WireGuard off"); err != nil {
			t.Errorf("WireGuard off: %v", err)
		}
		if check(nodecheck.Marks).Result != mptcpv1alpha1.CheckPassed || observeOnly() || markRules(t) != len(node.NICs) {
			t.Errorf("WireGuard off: Marks check %+v, observe-only %v, %d fwmark rules; want passed, enforcing, one per path",
				check(nodecheck.Marks), observeOnly(), markRules(t))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// markRules counts the current namespace's fwmark rules.
func markRules(t *testing.T) int {
	t.Helper()
	rules, err := netlink.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	return len(slices.DeleteFunc(rules, func(r netlink.Rule) bool { return r.Mark == 0 }))
}
