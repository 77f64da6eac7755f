package kube

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
)

// TestNodeConditionsGiveEveryReason: each row changes one input of a node
// that enforces its spec whole and wants, for each condition it names, the
// status and reason (absent: "") and where it matters the message, as the
// agent writes them.
func TestNodeConditionsGiveEveryReason(t *testing.T) {
	plan := &agent.Plan{Paths: make([]agent.PlanPath, 2), Pods: make([]agent.PlanPod, 3)}
	pathLeftOut := agent.Problem{Reason: ReasonInterfaceMissing, Message: "path fabric-z: no interface nic9 on this node"}
	badCIDR := agent.Problem{Reason: ReasonInvalidSpec, Message: `podCIDRs: "x" is not a prefix`}
	capsMissed := agent.Problem{Reason: ReasonCapsNotEnforced, Message: "rule r: its shape caps miss the tunnel"}
	base := func() conditionInputs {
		return conditionInputs{Generation: 7, Applied: plan, HasPods: true,
			Checks: []mptcpv1alpha1.NodeCheck{{Name: "Kernel", Result: mptcpv1alpha1.CheckPassed}}}
	}
	type want struct{ status, reason, message string }
	for _, c := range []struct {
		name   string
		change func(*conditionInputs)
		want   map[string]want
	}{
		{"enforced", func(*conditionInputs) {}, map[string]want{
			ConditionNodeSupported:     {"True", mptcpv1alpha1.ReasonChecksPassed, "every check passed"},
			ConditionDegraded:          {"False", ReasonAsExpected, "the spec is enforced"},
			ConditionReady:             {"True", ReasonApplied, "2 paths, 3 pods enforced"},
			ConditionProgressing:       {"False", ReasonSettled, "nothing pending"},
			ConditionTransparentKernel: {},
			ConditionPeersProbed:       {"True", ReasonAllPeersProbed, "liveness probes every peer on the paths it shares with this node"},
		}},
		{"check warns", func(in *conditionInputs) {
			in.Checks = append(in.Checks, mptcpv1alpha1.NodeCheck{Name: "CNI", Result: mptcpv1alpha1.CheckWarning, Message: "unknown CNI"})
		}, map[string]want{ConditionNodeSupported: {"True", mptcpv1alpha1.ReasonChecksWarned, "CNI: unknown CNI"}}},
		{"check fails", func(in *conditionInputs) {
			in.Checks = append(in.Checks, mptcpv1alpha1.NodeCheck{Name: "PodCIDRs", Result: mptcpv1alpha1.CheckFailed,
				Reason: mptcpv1alpha1.ReasonNoPodCIDRs, Message: "none"})
		}, map[string]want{ConditionNodeSupported: {"False", mptcpv1alpha1.ReasonNoPodCIDRs, "PodCIDRs: none"}}},
		{"path left out", func(in *conditionInputs) { in.Problems = []agent.Problem{pathLeftOut} }, map[string]want{
			ConditionDegraded: {"True", ReasonInterfaceMissing,
				"path fabric-z: no interface nic9 on this node; the last good configuration stays in force"},
			ConditionReady: {"True", ReasonApplied, "2 paths, 3 pods enforced (an earlier generation: this one was not applied)"},
		}},
		{"spec rejected", func(in *conditionInputs) { in.Problems = []agent.Problem{badCIDR} }, map[string]want{
			ConditionDegraded: {"True", ReasonInvalidSpec, `podCIDRs: "x" is not a prefix; the last good configuration stays in force`},
		}},
		{"spec rejected with a path left out", func(in *conditionInputs) { in.Problems = []agent.Problem{pathLeftOut, badCIDR} }, map[string]want{
			ConditionDegraded: {"True", ReasonInterfaceMissing,
				`path fabric-z: no interface nic9 on this node; podCIDRs: "x" is not a prefix; the last good configuration stays in force`},
		}},
		{"kernel refused", func(in *conditionInputs) {
			in.Problems = []agent.Problem{pathLeftOut, agent.ApplyProblem(errors.New("rule: file exists"))}
		}, map[string]want{ConditionDegraded: {"True", ReasonApplyFailed,
			"path fabric-z: no interface nic9 on this node; rule: file exists; the last good configuration stays in force"}}},
		{"marks clash", func(in *conditionInputs) {
			in.Problems = []agent.Problem{agent.ApplyProblem(fmt.Errorf("calico: %w", agent.ErrMarkClash))}
		}, map[string]want{ConditionDegraded: {"True", ReasonMarkClash, "calico: mark clash; the last good configuration stays in force"}}},
		{"caps miss an overlay", func(in *conditionInputs) { in.Problems = []agent.Problem{capsMissed} }, map[string]want{
			ConditionDegraded: {"True", ReasonCapsNotEnforced, "rule r: its shape caps miss the tunnel; the rest of the spec is enforced"},
			ConditionReady:    {"True", ReasonApplied, "2 paths, 3 pods enforced"},
		}},
		{"caps miss an overlay and a path is left out", func(in *conditionInputs) { in.Problems = []agent.Problem{capsMissed, pathLeftOut} },
			map[string]want{ConditionDegraded: {"True", ReasonInterfaceMissing,
				"rule r: its shape caps miss the tunnel; path fabric-z: no interface nic9 on this node; the last good configuration stays in force"}}},
		{"pods skipped", func(in *conditionInputs) { in.SkippedPods = 2 }, map[string]want{
			ConditionDegraded: {"False", ReasonPodsSkipped, "the spec is enforced but for 2 pods skipped for problems of their own: see status.pods"},
			ConditionReady:    {"True", ReasonApplied, "2 paths, 3 pods enforced, 2 skipped (status.pods)"},
		}},
		{"nothing applied yet", func(in *conditionInputs) { in.Applied, in.Problems = nil, []agent.Problem{badCIDR} }, map[string]want{
			ConditionReady: {"False", ReasonNotYetApplied, "no configuration could be enforced yet: see the Degraded condition"},
		}},
		{"a previous agent's in force", func(in *conditionInputs) { in.Applied, in.Inherited = nil, true }, map[string]want{
			ConditionReady: {"True", ReasonApplied, "the configuration a previous agent applied stays enforced (pinned datapath)"},
		}},
		{"pods waiting", func(in *conditionInputs) { in.Waiting = []string{"a/web", "b/api"} }, map[string]want{
			ConditionProgressing: {"True", ReasonWaitingForPods, "pods without an address yet: a/web, b/api"},
		}},
		{"socket program attached", func(in *conditionInputs) { in.Socket = agent.SocketMPTCP{Wanted: 2, Covered: 2} }, map[string]want{
			ConditionTransparentKernel: {"True", ReasonAttached, agent.SocketMPTCP{Wanted: 2, Covered: 2}.String()},
		}},
		{"socket program not covering", func(in *conditionInputs) {
			in.Socket = agent.SocketMPTCP{Wanted: 2, Covered: 1, Uncovered: map[string]bool{"a.web": true}}
		}, map[string]want{ConditionTransparentKernel: {"False", ReasonNotCovered, ""}}},
		{"observe-only", func(in *conditionInputs) { in.Socket = agent.SocketMPTCP{Wanted: 1, ObserveOnly: true} }, map[string]want{
			ConditionTransparentKernel: {"False", ReasonObserveOnly, "the node is observe-only: no socket is made MPTCP"},
		}},
		{"socket program load failed", func(in *conditionInputs) {
			in.Socket = agent.SocketMPTCP{Wanted: 1, Unsupported: "out of memory", Retrying: true}
		}, map[string]want{ConditionTransparentKernel: {"False", ReasonLoadFailed, ""}}},
		{"socket program refused", func(in *conditionInputs) { in.Socket = agent.SocketMPTCP{Wanted: 1, Unsupported: "lockdown"} }, map[string]want{
			ConditionTransparentKernel: {"False", ReasonUnsupported, "lockdown; the pods whose policy says podMPTCP.transparent kernel (1 here) keep " +
				"the sockets their programs ask for: use transparent inject (docs/transparent.md)"},
		}},
		{"peers beyond the limit", func(in *conditionInputs) { in.UnprobedPeers = 3 }, map[string]want{
			ConditionPeersProbed: {"False", ReasonPeersBeyondLimit, ""},
		}},
		{"no pods", func(in *conditionInputs) { in.HasPods = false }, map[string]want{ConditionPeersProbed: {}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := base()
			c.change(&in)
			conds := nodeConditions(nil, in)
			for typ, w := range c.want {
				got := meta.FindStatusCondition(conds, typ)
				switch {
				case w.status == "" && got != nil:
					t.Errorf("%s: %s %s, want none", typ, got.Status, got.Reason)
				case w.status == "":
				case got == nil:
					t.Errorf("%s: none, want %s %s", typ, w.status, w.reason)
				case string(got.Status) != w.status || got.Reason != w.reason || (w.message != "" && got.Message != w.message):
					t.Errorf("%s: %s %s %q, want %s %s %q", typ, got.Status, got.Reason, got.Message, w.status, w.reason, w.message)
				case got.ObservedGeneration != 7:
					t.Errorf("%s: observed generation %d, want 7", typ, got.ObservedGeneration)
				}
			}
		})
	}
}

// TestNodeConditionsKeepTheirOrderAndTransitions: the conditions come in
// the order the agent sets them, whatever the previous ones; one whose
// status stays keeps its transition time, one that changes takes Now, and
// one that no longer applies goes.
func TestNodeConditionsKeepTheirOrderAndTransitions(t *testing.T) {
	then := metav1.NewTime(time.Unix(1_000_000, 0))
	now := metav1.NewTime(time.Unix(2_000_000, 0))
	in := conditionInputs{Generation: 1, Now: then, HasPods: true, Socket: agent.SocketMPTCP{Wanted: 1, Covered: 1}}
	first := nodeConditions(nil, in)
	var types []string
	for _, c := range first {
		types = append(types, c.Type)
	}
	want := strings.Join([]string{ConditionNodeSupported, ConditionDegraded, ConditionReady, ConditionProgressing,
		ConditionTransparentKernel, ConditionPeersProbed}, ",")
	if got := strings.Join(types, ","); got != want {
		t.Errorf("conditions %s, want %s", got, want)
	}
	in.Now, in.Generation, in.Applied, in.Socket = now, 2, &agent.Plan{}, agent.SocketMPTCP{}
	second := nodeConditions(first, in)
	if c := meta.FindStatusCondition(second, ConditionDegraded); !c.LastTransitionTime.Equal(&then) || c.ObservedGeneration != 2 {
		t.Errorf("Degraded stayed False but moved to %v, generation %d", c.LastTransitionTime, c.ObservedGeneration)
	}
	if c := meta.FindStatusCondition(second, ConditionReady); c.Status != metav1.ConditionTrue || !c.LastTransitionTime.Equal(&now) {
		t.Errorf("Ready became %s at %v, want True at %v", c.Status, c.LastTransitionTime, now)
	}
	if meta.FindStatusCondition(second, ConditionTransparentKernel) != nil {
		t.Error("TransparentKernel stays while no pod wants the socket program")
	}
	if c := meta.FindStatusCondition(first, ConditionReady); c.Status != metav1.ConditionFalse {
		t.Errorf("the previous conditions were changed: Ready %s", c.Status)
	}
}
