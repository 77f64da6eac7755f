package kube

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/nodecheck"
	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// conditionInputs are what a node state's conditions are made of: what a
// reconcile found, enforced and left out.
type conditionInputs struct {
	Generation int64
	// Now is the transition time of the conditions that change status.
	Now metav1.Time
	// Problems are the node's (outcome.problems): none while the spec is
	// enforced whole; SkippedPods counts the pods skipped for problems of
	// their own.
	Problems    []agent.Problem
	SkippedPods int
	// Applied is the plan this process enforces (nil: none yet), and
	// Inherited that a previous agent's reported Ready.
	Applied   *agent.Plan
	Inherited bool
	// Waiting are the governed pods without an address yet.
	Waiting []string
	// Checks are status.checks.
	Checks []mptcpv1alpha1.NodeCheck
	// Socket is what the socket program of transparent kernel did.
	Socket agent.SocketMPTCP
	// HasPods: the spec has pods; UnprobedPeers: the peers liveness
	// leaves out beyond limits.ProbedPeers.
	HasPods       bool
	UnprobedPeers int
}

// nodeConditions are the conditions prev becomes with in: NodeSupported,
// Degraded, Ready, Progressing, TransparentKernel and PeersProbed, set in
// that order; a condition whose status stays keeps its transition time.
// It reads nothing else, so that every reason is tested from a table.
func nodeConditions(prev []metav1.Condition, in conditionInputs) []metav1.Condition {
	conds := slices.Clone(prev)
	set := func(c metav1.Condition) {
		c.ObservedGeneration, c.LastTransitionTime = in.Generation, in.Now
		meta.SetStatusCondition(&conds, c)
	}
	supported, reason, msg := nodecheck.Summary(in.Checks)
	set(metav1.Condition{Type: ConditionNodeSupported, Status: conditionStatus(supported), Reason: reason, Message: msg})
	degraded := degradedReason(in.Problems)
	// Caps that miss part of the traffic are the only problems of a spec
	// enforced whole: the lowest reason, present alone.
	enforced := degraded == ReasonCapsNotEnforced
	switch {
	case enforced:
		set(metav1.Condition{Type: ConditionDegraded, Status: metav1.ConditionTrue, Reason: degraded,
			Message: conditionMessage(agent.Messages(in.Problems)) + "; the rest of the spec is enforced"})
	case degraded != "":
		set(metav1.Condition{Type: ConditionDegraded, Status: metav1.ConditionTrue, Reason: degraded,
			Message: conditionMessage(agent.Messages(in.Problems)) + "; the last good configuration stays in force"})
	case in.SkippedPods > 0:
		// A tenant's pod is not the node's problem: the node enforces
		// everything else, and each skipped pod is reported on itself.
		set(metav1.Condition{Type: ConditionDegraded, Status: metav1.ConditionFalse, Reason: ReasonPodsSkipped,
			Message: fmt.Sprintf("the spec is enforced but for %d pods skipped for problems of their own: see status.pods", in.SkippedPods)})
	default:
		set(metav1.Condition{Type: ConditionDegraded, Status: metav1.ConditionFalse, Reason: ReasonAsExpected, Message: "the spec is enforced"})
	}
	set(readyCondition(in, degraded != "" && !enforced))
	if len(in.Waiting) > 0 {
		set(metav1.Condition{Type: ConditionProgressing, Status: metav1.ConditionTrue, Reason: ReasonWaitingForPods,
			Message: "pods without an address yet: " + strings.Join(in.Waiting, ", ")})
	} else {
		set(metav1.Condition{Type: ConditionProgressing, Status: metav1.ConditionFalse, Reason: ReasonSettled, Message: "nothing pending"})
	}
	if c, ok := transparentKernelCondition(in.Socket); ok {
		set(c)
	} else {
		meta.RemoveStatusCondition(&conds, ConditionTransparentKernel)
	}
	if c, ok := peersProbedCondition(in.HasPods, in.UnprobedPeers); ok {
		set(c)
	} else {
		meta.RemoveStatusCondition(&conds, ConditionPeersProbed)
	}
	return conds
}

// degradedRank orders the reasons of a node's problems: the Degraded
// condition says the highest present. A failed reconcile is why nothing
// new is enforced, whatever else the spec has; a path left out is what a
// user fixes first in a spec also rejected for other errors; caps that miss
// part of the traffic come last, in a spec enforced otherwise.
var degradedRank = map[string]int{
	ReasonCapsNotEnforced:  0,
	ReasonInvalidSpec:      1,
	ReasonInterfaceMissing: 2,
	ReasonApplyFailed:      3,
	ReasonMarkClash:        3,
}

// degradedReason is the reason of the Degraded condition problems make, ""
// for none.
func degradedReason(problems []agent.Problem) string {
	var reason string
	for _, p := range problems {
		if reason == "" || degradedRank[p.Reason] > degradedRank[reason] {
			reason = p.Reason
		}
	}
	return reason
}

// readyCondition: True while a configuration is in force, this process's
// or the one a previous agent left pinned; degraded says this generation's
// was not enforced whole.
func readyCondition(in conditionInputs, degraded bool) metav1.Condition {
	if in.Applied == nil && !in.Inherited {
		return metav1.Condition{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonNotYetApplied,
			Message: "no configuration could be enforced yet: see the Degraded condition"}
	}
	msg := "the configuration a previous agent applied stays enforced (pinned datapath)"
	if in.Applied != nil {
		msg = fmt.Sprintf("%d paths, %d pods enforced", len(in.Applied.Paths), len(in.Applied.Pods))
		if in.SkippedPods > 0 && !degraded {
			msg += fmt.Sprintf(", %d skipped (status.pods)", in.SkippedPods)
		}
	}
	if degraded {
		msg += " (an earlier generation: this one was not applied)"
	}
	return metav1.Condition{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonApplied, Message: msg}
}

// peersProbedCondition: absent (false) while the node has no pods (it
// probes nobody), True while its liveness probes every peer that shares a
// path with it, False while it leaves some out beyond the limit. The
// messages name no count: a node that joins or leaves must not change every
// node state's status (the count is a metric, the names are in the log).
func peersProbedCondition(hasPods bool, unprobed int) (metav1.Condition, bool) {
	if !hasPods {
		return metav1.Condition{}, false
	}
	cond := metav1.Condition{Type: ConditionPeersProbed, Status: metav1.ConditionTrue, Reason: ReasonAllPeersProbed,
		Message: "liveness probes every peer on the paths it shares with this node"}
	if unprobed > 0 {
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonPeersBeyondLimit
		cond.Message = fmt.Sprintf("more peers share a path with this node than a node probes (%d): it leaves out a draw of its own, "+
			"which other nodes probe, and a path failing towards those is found by their connections' retransmissions only; "+
			"mptcp_agent_liveness_peers{probed=\"false\"} counts them and the agent's log names them", limits.ProbedPeers)
	}
	return cond, true
}

// transparentKernelCondition is what the socket program did: absent
// (false) while no pod wants it; True (Attached) while it covers every pod
// that wants it; False with the reason otherwise (recordEvents warns once
// per reason and process).
func transparentKernelCondition(sm agent.SocketMPTCP) (metav1.Condition, bool) {
	cond := metav1.Condition{Type: ConditionTransparentKernel, Status: metav1.ConditionFalse}
	switch {
	case sm.Wanted == 0:
		return metav1.Condition{}, false
	case sm.ObserveOnly:
		cond.Reason = ReasonObserveOnly
		cond.Message = "the node is observe-only: no socket is made MPTCP"
	case sm.Unsupported != "" && sm.Retrying:
		cond.Reason = ReasonLoadFailed
		cond.Message = conditionMessage([]string{fmt.Sprintf("%s; the agent tries again every %s; meanwhile the pods whose policy says "+
			"podMPTCP.transparent kernel (%d here) keep the sockets their programs ask for", sm.Unsupported, agent.SocketRetry, sm.Wanted)})
	case sm.Unsupported != "":
		cond.Reason = ReasonUnsupported
		cond.Message = conditionMessage([]string{fmt.Sprintf("%s; the pods whose policy says podMPTCP.transparent kernel (%d here) keep "+
			"the sockets their programs ask for: use transparent inject (docs/transparent.md)", sm.Unsupported, sm.Wanted)})
	case sm.Covered < sm.Wanted:
		cond.Reason, cond.Message = ReasonNotCovered, conditionMessage([]string{sm.String()})
	default:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, ReasonAttached, sm.String()
	}
	return cond, true
}

// conditionMessage joins errs into at most 1024 bytes, the most an event's
// note holds, cut at a character's start.
func conditionMessage(errs []string) string {
	return truncate(strings.Join(errs, "; "), 1024)
}

func conditionStatus(ok bool) metav1.ConditionStatus {
	if ok {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}
