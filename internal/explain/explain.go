// Package explain answers the question MPTCP users ask most: why does this
// pod's connection have one subflow? It walks, in order, what decides a
// pod's subflows (its selection, the node's agent, the pod's gate, the rule
// that won, the paths on the node, the path manager, and what the pod's
// kernel counted: fallbacks, checksum errors, refused joins) and names each
// step that stops or limits them with a Cause, which docs/troubleshooting.md
// explains. It reads only the facts it is given; `kubectl mptcp explain`
// gathers them through the API server. A fact the caller could not read (a
// user without the right to read node states, or to exec into the agent)
// makes the steps that need it say so, marked unread, and the walk goes on
// with the rest.
package explain

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agentapi"
)

// Cause names what stops or limits a pod's subflows. Each has an entry in
// docs/troubleshooting.md under its name.
type Cause string

const (
	// CauseHostNetwork: a host-network pod is never selected (its sockets
	// are the node's).
	CauseHostNetwork Cause = "HostNetwork"
	// CauseNotSelected: no policy selects the pod (or it has no node or
	// address yet).
	CauseNotSelected Cause = "NotSelected"
	// CauseAgentMissing: no agent has reported for the pod's node.
	CauseAgentMissing Cause = "AgentMissing"
	// CausePodSkipped: the node's agent skipped the pod for a problem of
	// its own (the node state's status.pods).
	CausePodSkipped Cause = "PodSkipped"
	// CauseGateNotReady: the pod's mptcp.io/ready gate is not True.
	CauseGateNotReady Cause = "GateNotReady"
	// CauseCappedToOne: the pod's rule allows one subflow (maxSubflows 1).
	CauseCappedToOne Cause = "CappedToOne"
	// CauseOnePath: the pod's rule has one path or none on the node.
	CauseOnePath Cause = "OnePath"
	// CausePathDown: a path of the pod's rule is down on the node.
	CausePathDown Cause = "PathDown"
	// CauseGuestDecides: subflowCreation guest; the VM's own kernel opens
	// the subflows.
	CauseGuestDecides Cause = "GuestDecides"
	// CausePathManagerDown: the agent's path manager of the pod (userspace
	// mode) is not running.
	CausePathManagerDown Cause = "PathManagerDown"
	// CausePeerNotMPTCP: connections of the pod fell back to TCP at the
	// handshake: the peer, or something between, does not speak MPTCP.
	CausePeerNotMPTCP Cause = "PeerNotMPTCP"
	// CauseFallback: connections that were MPTCP on the pod's side fell
	// back to TCP (a middlebox stripped the options after the SYN, an
	// infinite mapping after a checksum failure, data without a mapping).
	CauseFallback Cause = "Fallback"
	// CauseChecksumErrors: data changed on its way to or from the pod.
	CauseChecksumErrors Cause = "ChecksumErrors"
	// CauseJoinsRefused: the node refuses joins that the pod's rule does
	// not allow (a blocked path, more than maxSubflows).
	CauseJoinsRefused Cause = "JoinsRefused"
)

// Causes lists every cause, in the order the walk reaches them.
var Causes = []Cause{
	CauseHostNetwork, CauseNotSelected, CauseAgentMissing, CausePodSkipped, CauseGateNotReady, CauseCappedToOne,
	CauseOnePath, CausePathDown, CauseGuestDecides, CausePathManagerDown, CausePeerNotMPTCP, CauseFallback,
	CauseChecksumErrors, CauseJoinsRefused,
}

// Facts are what explain reads of one pod. Only Pod is required.
type Facts struct {
	Pod *corev1.Pod
	// Namespace is the pod's namespace, for its labels; nil if unread.
	Namespace *corev1.Namespace
	// NodeState is the MPTCPNodeState of the pod's node; nil: none.
	NodeState *mptcpv1alpha1.MPTCPNodeState
	// Policies are the cluster's policies, for the hints of an unselected
	// pod.
	Policies []mptcpv1alpha1.MPTCPPolicy
	// Events are the events about the pod.
	Events []eventsv1.Event
	// Agent is what the node's agent reports of the pod; nil when it was
	// not read, AgentError then says why.
	Agent      *agentapi.PodReport
	AgentError string
	// Why the node state, the namespace, the policies or the events could
	// not be read (a Forbidden, for a user without get on them); empty:
	// read, or not found.
	NodeStateError, NamespaceError, PoliciesError, EventsError string
}

// Step is one step of the walk: what it found, and the cause when it stops
// or limits the pod's subflows.
type Step struct {
	Name   string `json:"step"`
	Cause  Cause  `json:"cause,omitempty"`
	Detail string `json:"detail"`
	// Unread: what the step needs could not be read; Detail says why and
	// what is not checked.
	Unread bool `json:"unread,omitempty"`
}

// Explanation is the walk for one pod.
type Explanation struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Node      string `json:"node,omitempty"`
	Steps     []Step `json:"steps"`
	// Causes are the steps' causes, each once, in the walk's order.
	Causes []Cause `json:"causes"`
	// Unread names the steps that could not be checked, in the walk's
	// order: a cause may hide there.
	Unread []string `json:"unread,omitempty"`
}

// Has says whether the explanation names cause c.
func (e Explanation) Has(c Cause) bool { return slices.Contains(e.Causes, c) }

type walk struct {
	Explanation
}

func (w *walk) ok(step, format string, args ...any) {
	w.Steps = append(w.Steps, Step{Name: step, Detail: fmt.Sprintf(format, args...)})
}

// unread records a step that could not be checked, and why.
func (w *walk) unread(step, format string, args ...any) {
	w.Steps = append(w.Steps, Step{Name: step, Unread: true, Detail: fmt.Sprintf(format, args...)})
	w.Unread = append(w.Unread, step)
}

func (w *walk) cause(step string, c Cause, format string, args ...any) {
	w.Steps = append(w.Steps, Step{Name: step, Cause: c, Detail: fmt.Sprintf(format, args...)})
	if !slices.Contains(w.Causes, c) {
		w.Causes = append(w.Causes, c)
	}
}

// Explain walks what decides the subflows of f.Pod.
func Explain(f Facts) Explanation {
	pod := f.Pod
	w := &walk{Explanation{Namespace: pod.Namespace, Name: pod.Name, Node: pod.Spec.NodeName, Steps: []Step{}, Causes: []Cause{}}}
	if pod.Spec.HostNetwork {
		w.cause("selection", CauseHostNetwork, "the pod uses the node's network: no policy applies to its sockets")
		return w.Explanation
	}
	if f.NodeStateError != "" {
		// Without the node state, whether the pod is selected, by which
		// rule and over which paths is unknown; the pod's own gate and
		// what its agent reports still say much.
		w.unread("selection", "node %s's MPTCPNodeState not read (%s): the pod's selection, its node's agent, its rule's limits and paths are not checked",
			pod.Spec.NodeName, f.NodeStateError)
		w.gate(pod)
		w.agentData(f, nil)
		return w.Explanation
	}
	entry := selected(f)
	if entry == nil {
		w.cause("selection", CauseNotSelected, "%s", notSelected(f))
		return w.Explanation
	}
	state := f.NodeState
	rule := firstRule(state, entry.Rules)
	w.ok("selection", "%s", ruleDetails(rule, entry.Rules))

	if !agentReported(state) {
		w.cause("agent", CauseAgentMissing, "no agent has reported for node %s: is the agent's pod running there (kubectl mptcp status)?", pod.Spec.NodeName)
		return w.Explanation
	}
	if i := slices.IndexFunc(state.Status.Pods, func(p mptcpv1alpha1.PodProblem) bool {
		return p.Namespace == pod.Namespace && p.Name == pod.Name
	}); i >= 0 {
		p := state.Status.Pods[i]
		w.cause("agent", CausePodSkipped, "the agent of node %s skipped the pod: %s: %s", pod.Spec.NodeName, p.Reason, p.Message)
		return w.Explanation
	}
	w.ok("agent", "node %s's agent applied generation %d", pod.Spec.NodeName, state.Status.ObservedGeneration)
	w.gate(pod)

	if rule == nil {
		// The agent reports a pod whose rules are missing as skipped;
		// without a rule there is nothing more to walk.
		return w.Explanation
	}
	w.limits(f, rule)
	w.paths(state, rule)
	w.agentData(f, rule)
	return w.Explanation
}

// gate: the pod's mptcp.io/ready condition.
func (w *walk) gate(pod *corev1.Pod) {
	if gate := podGate(pod); gate == nil {
		w.cause("gate", CauseGateNotReady, "the pod has no %s condition yet: its agent has not configured it", mptcpv1alpha1.PodReadyCondition)
	} else if gate.Status != corev1.ConditionTrue {
		w.cause("gate", CauseGateNotReady, "%s is %s: %s: %s", mptcpv1alpha1.PodReadyCondition, gate.Status, gate.Reason, gate.Message)
	} else {
		w.ok("gate", "%s is True: %s", mptcpv1alpha1.PodReadyCondition, gate.Message)
	}
}

// limits: what the rule allows a connection.
func (w *walk) limits(f Facts, rule *mptcpv1alpha1.CompiledRule) {
	switch rule.SubflowCreation {
	case mptcpv1alpha1.SubflowCreationGuest:
		w.cause("subflow creation", CauseGuestDecides, "rule %s says guest: the VM's own kernel and path manager open the subflows, the node only places them (docs/vms.md)", rule.Name)
	case mptcpv1alpha1.SubflowCreationSignal:
		w.ok("subflow creation", "signal: the pod announces ports %v; a peer joins them only if its path manager accepts announcements (add_addr_accepted)", rule.SignalPorts)
	default:
		w.ok("subflow creation", "userspace: the node's agent opens the joins from the pod")
	}
	if cc := rule.CongestionControl; cc != "" {
		note := ""
		if cc == "bbr" {
			note = "; its subflows' PROBE_RTTs fall together: a connection pauses 150-250 ms about every 10 s (docs/install.md)"
		}
		w.ok("congestion control", "%s, set in the pod's network namespace by its agent (podMPTCP.congestionControl)%s", cc, note)
	}
	if rule.MaxSubflows == 1 {
		detail := fmt.Sprintf("policy %s allows one subflow per connection (maxSubflows: 1)", rule.Policy)
		if e := lastEvent(f.Events, "CappedByNamespacePolicy", "mptcp-nodestate"); e != "" {
			detail += "; " + e
		} else if f.EventsError != "" {
			detail += fmt.Sprintf("; the pod's events not read (%s)", f.EventsError)
		}
		w.cause("maxSubflows", CauseCappedToOne, "%s", detail)
		return
	}
	w.ok("maxSubflows", "%d subflows per connection", rule.MaxSubflows)
}

// paths: the rule's paths on the node, and whether they are up.
func (w *walk) paths(state *mptcpv1alpha1.MPTCPNodeState, rule *mptcpv1alpha1.CompiledRule) {
	var names []string
	for _, p := range rule.Paths {
		names = append(names, p.Name)
	}
	names = append(names, rule.BackupPaths...)
	if len(names) < 2 {
		detail := fmt.Sprintf("rule %s has %d path(s) on node %s: %v", rule.Name, len(names), state.Name, names)
		if len(rule.BlockedPaths) > 0 {
			detail += fmt.Sprintf("; blocked: %v", rule.BlockedPaths)
		}
		w.cause("paths", CauseOnePath, "%s", detail)
	} else {
		w.ok("paths", "%v (backup %v, blocked %v)", names[:len(rule.Paths)], rule.BackupPaths, rule.BlockedPaths)
	}
	var down []string
	for _, name := range names {
		i := slices.IndexFunc(state.Status.Paths, func(p mptcpv1alpha1.PathState) bool { return p.Name == name })
		if i < 0 {
			down = append(down, fmt.Sprintf("%s: not in the node's status (no interface found)", name))
			continue
		}
		p := state.Status.Paths[i]
		switch {
		case p.Link != mptcpv1alpha1.LinkUp:
			d := fmt.Sprintf("%s: link %s on %q", name, p.Link, p.Interface)
			if p.Message != "" {
				d += " (" + p.Message + ")"
			}
			down = append(down, d)
		case p.Liveness == mptcpv1alpha1.LivenessFailing:
			down = append(down, fmt.Sprintf("%s: liveness Failing (a peer stopped echoing probes over it)", name))
		}
	}
	if len(down) > 0 {
		w.cause("path state", CausePathDown, "on node %s: %s; a path down carries no new subflow", state.Name, strings.Join(down, "; "))
	} else if len(names) > 0 {
		w.ok("path state", "every path of the rule is up on node %s", state.Name)
	}
}

// Counters of the pod's kernel (MPTcpExt in /proc/net/netstat) that explain
// reads.
var (
	// The pod's SYN offered MPTCP and the SYN-ACK did not: the peer does
	// not speak it, or something between stripped it.
	handshakeFallbacks = []string{"MPCapableFallbackSYNACK"}
	// A connection that was MPTCP on the pod's side fell back: the peer's
	// ACK dropped the MPTCP its SYN offered (a middlebox stripped the
	// pod's MP_CAPABLE on its way), data came without a mapping, an
	// infinite mapping after a checksum failure.
	laterFallbacks = []string{"MPCapableFallbackACK", "InfiniteMapRx", "DSSCorruptionFallback", "DssFallback", "MPCapableDataFallback",
		"MPFallbackTokenInit", "SimultConnectFallback", "MD5SigFallback"}
	checksumCounters = []string{"DataCsumErr", "MPFailTx", "MPFailRx"}
)

// agentData: what the node's agent and the pod's kernel report. rule is
// nil when the node state was not read.
func (w *walk) agentData(f Facts, rule *mptcpv1alpha1.CompiledRule) {
	a := f.Agent
	if a == nil {
		w.unread("agent data", "not read (%s): connections, fallbacks, checksum errors and refused joins are not checked", f.AgentError)
		return
	}
	if !a.Configured {
		w.ok("agent data", "the node's agent does not configure the pod yet")
		return
	}
	// The agent reports a path manager only where the pod's joins are its
	// to open (userspace mode).
	if (rule == nil || rule.SubflowCreation == mptcpv1alpha1.SubflowCreationUserspace) && a.PathManager != nil && !a.PathManager.Up {
		w.cause("path manager", CausePathManagerDown, "the agent's path manager of the pod is not running (restarted %d times): no join is opened until it is back", a.PathManager.Restarts)
	}
	one := 0
	for _, c := range a.Connections {
		if len(c.Subflows) <= 1 {
			one++
		}
	}
	w.ok("connections", "%d in the node's tables, %d of them with one subflow", len(a.Connections), one)
	if a.CountersError != "" {
		w.unread("kernel counters", "not read: %s", a.CountersError)
		return
	}
	if n, list := sum(a.Counters, handshakeFallbacks); n > 0 {
		w.cause("peer", CausePeerNotMPTCP, "%d connections fell back to TCP at the handshake (%s): the peer, or a middlebox between, does not speak MPTCP", n, list)
	}
	if n, list := sum(a.Counters, laterFallbacks); n > 0 {
		w.cause("fallback", CauseFallback, "%d connections or subflows that were MPTCP on the pod's side fell back to TCP (%s): a middlebox that strips or changes MPTCP options, or data changed on its way", n, list)
	}
	if n, list := sum(a.Counters, checksumCounters); n > 0 {
		w.cause("data", CauseChecksumErrors, "data changed on its way (%s): DSS checksums caught it; each failure resets a subflow, or makes a lone subflow fall back", list)
	}
	if a.NodeJoinsRefused > 0 && rule != nil && len(rule.BlockedPaths) > 0 {
		w.cause("joins", CauseJoinsRefused, "rule %s blocks %v: the node answers a peer's join arriving there with a reset; node %s refused %d joins (the datapath counts them for the node, not per pod)",
			rule.Name, rule.BlockedPaths, f.Pod.Spec.NodeName, a.NodeJoinsRefused)
	}
	if len(w.Causes) == 0 && len(w.Unread) == 0 {
		w.ok("verdict", "nothing found that limits the pod's subflows: a connection with one subflow is its program's (it asked for TCP: docs/transparent.md) or its peer's choice")
	}
}

func sum(counters map[string]uint64, names []string) (uint64, string) {
	var n uint64
	var parts []string
	for _, name := range names {
		if v := counters[name]; v > 0 {
			n += v
			parts = append(parts, fmt.Sprintf("%s %d", name, v))
		}
	}
	return n, strings.Join(parts, ", ")
}

// selected is the pod's entry in its node state, nil if none.
func selected(f Facts) *mptcpv1alpha1.NodePod {
	if f.NodeState == nil {
		return nil
	}
	i := slices.IndexFunc(f.NodeState.Spec.Pods, func(p mptcpv1alpha1.NodePod) bool {
		return p.Namespace == f.Pod.Namespace && p.Name == f.Pod.Name && (p.UID == "" || p.UID == string(f.Pod.UID))
	})
	if i < 0 {
		return nil
	}
	return &f.NodeState.Spec.Pods[i]
}

// notSelected says why a pod is not in its node's state.
func notSelected(f Facts) string {
	pod := f.Pod
	switch {
	case pod.Spec.NodeName == "":
		return "the pod is not bound to a node yet"
	case pod.Status.PodIP == "":
		return "the pod has no address yet"
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return "the pod has finished"
	}
	var nsLabels labels.Set
	if f.Namespace != nil {
		nsLabels = f.Namespace.Labels
	}
	var unread []string
	if f.NamespaceError != "" {
		unread = append(unread, fmt.Sprintf("namespace %s not read (%s)", pod.Namespace, f.NamespaceError))
	}
	if f.PoliciesError != "" {
		unread = append(unread, fmt.Sprintf("MPTCPPolicies not read (%s)", f.PoliciesError))
	}
	if len(unread) > 0 {
		// Which policy nearly selects the pod cannot be told.
		return fmt.Sprintf("node %s's state does not list the pod; %s", pod.Spec.NodeName, strings.Join(unread, "; "))
	}
	var near []string
	for _, p := range f.Policies {
		nsSel, err := metav1.LabelSelectorAsSelector(p.Spec.NamespaceSelector)
		if err != nil || f.Namespace == nil || !nsSel.Matches(nsLabels) {
			continue
		}
		podSel := labels.Everything()
		if p.Spec.PodSelector != nil {
			if podSel, err = metav1.LabelSelectorAsSelector(p.Spec.PodSelector); err != nil {
				continue
			}
		}
		if podSel.Matches(labels.Set(pod.Labels)) {
			near = append(near, fmt.Sprintf("policy %s selects it, but node %s's state does not list it yet (the controller compiles it: wait, then kubectl describe mptcpnodestate %s)",
				p.Name, pod.Spec.NodeName, pod.Spec.NodeName))
		} else {
			near = append(near, fmt.Sprintf("policy %s selects namespace %s but not the pod's labels (podSelector %s)", p.Name, pod.Namespace, podSel))
		}
	}
	if len(near) == 0 {
		return fmt.Sprintf("no MPTCPPolicy selects namespace %s (labels %s): label it as a policy's namespaceSelector asks, or write a policy for it", pod.Namespace, nsLabels)
	}
	return "no policy governs the pod: " + strings.Join(near, "; ")
}

// ruleDetails names the pod's rules and the policy that won.
func ruleDetails(rule *mptcpv1alpha1.CompiledRule, names mptcpv1alpha1.RuleNames) string {
	if rule == nil {
		return fmt.Sprintf("rules %v, the first missing from the node state", names)
	}
	s := fmt.Sprintf("policy %s governs the pod (rule %s, priority %d)", rule.Policy, rule.Name, rule.Priority)
	if len(names) > 1 {
		s += fmt.Sprintf("; %d more rules apply to traffic the first does not match: %v", len(names)-1, []string(names[1:]))
	}
	return s
}

func firstRule(state *mptcpv1alpha1.MPTCPNodeState, names mptcpv1alpha1.RuleNames) *mptcpv1alpha1.CompiledRule {
	if len(names) == 0 {
		return nil
	}
	i := slices.IndexFunc(state.Spec.Rules, func(r mptcpv1alpha1.CompiledRule) bool { return r.Name == names[0] })
	if i < 0 {
		return nil
	}
	return &state.Spec.Rules[i]
}

// agentReported: an agent acted on the node state at least once.
func agentReported(state *mptcpv1alpha1.MPTCPNodeState) bool {
	return state.Status.ObservedGeneration > 0 && meta.FindStatusCondition(state.Status.Conditions, mptcpv1alpha1.ConditionReady) != nil
}

func podGate(pod *corev1.Pod) *corev1.PodCondition {
	for i, c := range pod.Status.Conditions {
		if string(c.Type) == mptcpv1alpha1.PodReadyCondition {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// lastEvent is the note of the newest event of reason that controller
// reported, "" if none: an event another writer made up is not quoted.
func lastEvent(events []eventsv1.Event, reason, controller string) string {
	var note string
	var at metav1.MicroTime
	for _, e := range events {
		if e.Reason == reason && e.ReportingController == controller && !e.EventTime.Before(&at) {
			note, at = e.Note, e.EventTime
		}
	}
	return note
}
