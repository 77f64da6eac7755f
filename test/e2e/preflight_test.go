package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/kubectlmptcp"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
)

// calicoConf is the CNI configuration Calico installs, as a node's
// container runtime would find it first.
const calicoConf = `{"name":"k8s-pod-network","cniVersion":"0.3.1","plugins":[{"type":"calico","ipam":{"type":"calico-ipam"}},{"type":"portmap","capabilities":{"portMappings":true}}]}`

// requirePreflight runs kubectl mptcp preflight on a kube bed whose node 1
// has lost fabric-b's carrier: every node's agent reports the bed's CNI
// (ptp, routed), marks that do not clash and the node's pod CIDRs, and node
// 1's path down fails. Then a Node made without pod CIDRs, and a mark
// clash made on node 2 (Calico's configuration put first in its CNI
// directory, its agent restarted): preflight names both, and node 2's agent
// enforces nothing, Degraded with MarkClash.
func requirePreflight(t *testing.T, kb *kubeBed, plugin *kubectlMPTCP) {
	t.Helper()
	ctx, c := context.Background(), kb.env.Client
	var p kubectlmptcp.Preflight
	if code := plugin.run(t, &p, "preflight"); code != 3 {
		t.Errorf("kubectl mptcp preflight with a path down: exit %d, want 3 (a check failed)", code)
	}
	for _, n := range kb.bed.Nodes {
		checks := preflightOf(t, p, framework.NodeName(n))
		for _, name := range []string{"Agent", "Kernel", "BTF", "BPFFS", "CNI", "Marks", "PodCIDRs"} {
			if checks[name].Result != mptcpv1alpha1.CheckPassed {
				t.Errorf("node %d: check %s %+v, want Passed", n.Index, name, checks[name])
			}
		}
		if !strings.HasPrefix(checks["CNI"].Message, "ptp (routed) from /etc/cni/net.d/") {
			t.Errorf("node %d: CNI check %q, want the bed's ptp, routed, from the node's configuration", n.Index, checks["CNI"].Message)
		}
	}
	if c := preflightOf(t, p, framework.NodeName(kb.bed.Node(1)))["Paths"]; c.Result != mptcpv1alpha1.CheckFailed || !strings.Contains(c.Message, "fabric-b") {
		t.Errorf("node 1's paths check with fabric-b's carrier lost: %+v", c)
	}

	// A node an agent would run on, without pod CIDRs.
	bare := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "no-pod-cidrs", Labels: map[string]string{"mptcp.io/multipath": "true"}}}
	if err := c.Create(ctx, bare); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), bare) })

	// Node 2's runtime finds Calico's configuration first; its agent,
	// restarted, finds Calico's marks in its mask.
	node2 := kb.bed.Node(2)
	conf := filepath.Join(kb.bed.NodeStateDir(node2), "etc", "cni", "net.d", "00-calico.conflist")
	if err := os.WriteFile(conf, []byte(calicoConf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(conf) })
	kb.signalAgent(t, node2, syscall.SIGKILL)
	state := kb.waitState(t, node2, "refusing for a mark clash", func(s *mptcpv1alpha1.MPTCPNodeState) bool {
		d := meta.FindStatusCondition(s.Status.Conditions, mptcpv1alpha1.ConditionDegraded)
		return d != nil && d.Status == metav1.ConditionTrue && d.Reason == mptcpv1alpha1.ReasonMarkClash
	})
	if s := meta.FindStatusCondition(state.Status.Conditions, mptcpv1alpha1.ConditionNodeSupported); s == nil || s.Status != metav1.ConditionFalse ||
		s.Reason != mptcpv1alpha1.ReasonMarkClash || !strings.Contains(s.Message, "0x00000f00") {
		t.Errorf("node 2's NodeSupported condition %+v, want False MarkClash suggesting 0x00000f00", s)
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		code := plugin.run(t, &p, "preflight")
		marks := preflightOf(t, p, framework.NodeName(node2))["Marks"]
		cidrs := preflightOf(t, p, bare.Name)["PodCIDRs"]
		cni := preflightOf(t, p, framework.NodeName(node2))["CNI"]
		ok := code == 3 && marks.Reason == mptcpv1alpha1.ReasonMarkClash && strings.Contains(marks.Message, "calico uses skb->mark bits 0xffff0000") &&
			marks.Help == "docs/troubleshooting.md#markclash" && cidrs.Reason == mptcpv1alpha1.ReasonNoPodCIDRs &&
			strings.HasPrefix(cni.Message, "calico (routed) from /etc/cni/net.d/00-calico.conflist")
		if ok {
			t.Logf("preflight: node 2 %s: %s; %s: %s", marks.Reason, marks.Message, bare.Name, cidrs.Message)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubectl mptcp preflight (exit %d) names node 2's marks %+v, CNI %+v and %s's pod CIDRs %+v; want MarkClash for calico and NoPodCIDRs",
				code, marks, cni, bare.Name, cidrs)
		}
		time.Sleep(time.Second)
	}
	var s mptcpv1alpha1.MPTCPNodeState
	if err := c.Get(ctx, types.NamespacedName{Name: framework.NodeName(node2)}, &s); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(s.Status.Errors, func(e string) bool { return strings.HasPrefix(e, "mark clash: calico uses") }) {
		t.Errorf("node 2's errors %v, want the mark clash", s.Status.Errors)
	}
}

// preflightOf is the checks of node in p by name.
func preflightOf(t *testing.T, p kubectlmptcp.Preflight, node string) map[string]kubectlmptcp.PreflightCheck {
	t.Helper()
	for _, n := range p.Nodes {
		if n.Name == node {
			out := map[string]kubectlmptcp.PreflightCheck{}
			for _, c := range n.Checks {
				out[c.Name] = c
			}
			return out
		}
	}
	return nil
}
