package explain

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agentapi"
)

// healthy are the facts of a pod whose subflows nothing limits: selected by
// policy spread over two paths that are up, configured, its agent's report
// clean. Each case below changes one thing.
func healthy() Facts {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web", UID: "u1", Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.1.10", Conditions: []corev1.PodCondition{
			{Type: mptcpv1alpha1.PodReadyCondition, Status: corev1.ConditionTrue, Reason: "Configured"},
		}},
	}
	state := &mptcpv1alpha1.MPTCPNodeState{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Generation: 2},
		Spec: mptcpv1alpha1.MPTCPNodeStateSpec{
			Rules: []mptcpv1alpha1.CompiledRule{{
				Name: "spread", Policy: "spread", MaxSubflows: 4, SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace,
				Paths: []mptcpv1alpha1.RulePath{{Name: "fabric-a", Weight: 1}, {Name: "fabric-b", Weight: 1}},
			}},
			Pods: []mptcpv1alpha1.NodePod{{Namespace: "apps", Name: "web", UID: "u1", Rules: mptcpv1alpha1.RuleNames{"spread"}}},
		},
		Status: mptcpv1alpha1.MPTCPNodeStateStatus{
			ObservedGeneration: 2,
			Paths: []mptcpv1alpha1.PathState{
				{Name: "fabric-a", Interface: "nic1", Link: mptcpv1alpha1.LinkUp, Liveness: mptcpv1alpha1.LivenessAlive},
				{Name: "fabric-b", Interface: "nic2", Link: mptcpv1alpha1.LinkUp, Liveness: mptcpv1alpha1.LivenessAlive},
			},
			Conditions: []metav1.Condition{{Type: mptcpv1alpha1.ConditionReady, Status: metav1.ConditionTrue}},
		},
	}
	return Facts{
		Pod:       pod,
		Namespace: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps", Labels: map[string]string{"tenant": "yes"}}},
		NodeState: state,
		Policies: []mptcpv1alpha1.MPTCPPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "spread"}, Spec: mptcpv1alpha1.MPTCPPolicySpec{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "yes"}},
		}}},
		Agent: &agentapi.PodReport{Namespace: "apps", Name: "web", Configured: true, Counters: map[string]uint64{"MPCapableSYNTX": 5},
			PathManager: &agentapi.PathManagerInfo{Up: true}},
	}
}

func TestEachCauseIsNamedForTheFactThatMakesIt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Facts)
		want   []Cause
	}{
		{"nothing limits it", func(*Facts) {}, nil},
		{"host network", func(f *Facts) { f.Pod.Spec.HostNetwork = true }, []Cause{CauseHostNetwork}},
		{"labels no policy selects", func(f *Facts) { f.NodeState.Spec.Pods = nil }, []Cause{CauseNotSelected}},
		{"another pod of the same name", func(f *Facts) { f.Pod.UID = "u2" }, []Cause{CauseNotSelected}},
		{"no agent reported", func(f *Facts) { f.NodeState.Status = mptcpv1alpha1.MPTCPNodeStateStatus{} }, []Cause{CauseAgentMissing}},
		{"skipped", func(f *Facts) {
			f.NodeState.Status.Pods = []mptcpv1alpha1.PodProblem{{Namespace: "apps", Name: "web", Reason: mptcpv1alpha1.PodRuleTableFull}}
		}, []Cause{CausePodSkipped}},
		{"gate false", func(f *Facts) { f.Pod.Status.Conditions[0].Status = corev1.ConditionFalse }, []Cause{CauseGateNotReady}},
		{"gate absent", func(f *Facts) { f.Pod.Status.Conditions = nil }, []Cause{CauseGateNotReady}},
		{"maxSubflows 1", func(f *Facts) { f.NodeState.Spec.Rules[0].MaxSubflows = 1 }, []Cause{CauseCappedToOne}},
		{"one path", func(f *Facts) { f.NodeState.Spec.Rules[0].Paths = f.NodeState.Spec.Rules[0].Paths[:1] }, []Cause{CauseOnePath}},
		{"link down", func(f *Facts) { f.NodeState.Status.Paths[1].Link = mptcpv1alpha1.LinkDown }, []Cause{CausePathDown}},
		{"liveness failing", func(f *Facts) { f.NodeState.Status.Paths[0].Liveness = mptcpv1alpha1.LivenessFailing }, []Cause{CausePathDown}},
		{"guest", func(f *Facts) { f.NodeState.Spec.Rules[0].SubflowCreation = mptcpv1alpha1.SubflowCreationGuest }, []Cause{CauseGuestDecides}},
		{"path manager down", func(f *Facts) { f.Agent.PathManager.Up = false }, []Cause{CausePathManagerDown}},
		{"peer answered without MPTCP", func(f *Facts) { f.Agent.Counters["MPCapableFallbackSYNACK"] = 3 }, []Cause{CausePeerNotMPTCP}},
		{"a middlebox stripped the SYN-ACK's MP_CAPABLE", func(f *Facts) { f.Agent.Counters["MPCapableFallbackACK"] = 1 }, []Cause{CauseFallback}},
		{"infinite mapping", func(f *Facts) {
			f.Agent.Counters["InfiniteMapRx"] = 1
			f.Agent.Counters["DataCsumErr"] = 1
		}, []Cause{CauseFallback, CauseChecksumErrors}},
		{"blocked path refuses joins", func(f *Facts) {
			f.NodeState.Spec.Rules[0].BlockedPaths = []string{"fabric-c"}
			f.Agent.NodeJoinsRefused = 2
		}, []Cause{CauseJoinsRefused}},
		{"joins refused for another pod's rule", func(f *Facts) { f.Agent.NodeJoinsRefused = 2 }, nil},
		{"agent not read", func(f *Facts) { f.Agent, f.AgentError = nil, "pods/exec forbidden" }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := healthy()
			tc.change(&f)
			e := Explain(f)
			if !slices.Equal(e.Causes, tc.want) && (len(e.Causes) != 0 || len(tc.want) != 0) {
				t.Errorf("causes %v, want %v; steps %+v", e.Causes, tc.want, e.Steps)
			}
			for _, s := range e.Steps {
				if s.Detail == "" {
					t.Errorf("step %s says nothing", s.Name)
				}
			}
		})
	}
}

// An unselected pod is told which policy nearly selects it, and the
// namespace cap's event reaches the capped pod's explanation.
func TestHintsNameThePolicies(t *testing.T) {
	f := healthy()
	f.NodeState.Spec.Pods = nil
	f.Policies[0].Spec.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}
	e := Explain(f)
	if got := e.Steps[0].Detail; !strings.Contains(got, "policy spread selects namespace apps but not the pod's labels") {
		t.Errorf("unselected pod's step: %q, want the policy that selects its namespace named", got)
	}
	f = healthy()
	f.NodeState.Spec.Rules[0].MaxSubflows = 1
	f.Events = []eventsv1.Event{
		{Reason: "CappedByNamespacePolicy", Note: "capped by namespace policy one", ReportingController: "mptcp-nodestate"},
		// A note another writer made up is not quoted.
		{Reason: "CappedByNamespacePolicy", Note: "made up", ReportingController: "tenant",
			EventTime: metav1.NewMicroTime(time.Now().Add(time.Hour))},
	}
	e = Explain(f)
	i := slices.IndexFunc(e.Steps, func(s Step) bool { return s.Cause == CauseCappedToOne })
	if i < 0 || !strings.Contains(e.Steps[i].Detail, "capped by namespace policy one") || strings.Contains(e.Steps[i].Detail, "made up") {
		t.Errorf("capped pod's steps %+v, want the cap's event in the maxSubflows step", e.Steps)
	}
}

// A user who may not read node states (a tenant: a node state lists every
// pod of its node) or exec into the agent still gets every step the other
// The congestion control the agent sets in the pod is a step of its own,
// and bbr's periodic pause is named there.
func TestTheCongestionControlIsAStep(t *testing.T) {
	for cc, want := range map[string]string{"cubic": "cubic, set in the pod's network namespace", "bbr": "pauses 150-250 ms about every 10 s", "": ""} {
		f := healthy()
		f.NodeState.Spec.Rules[0].CongestionControl = cc
		e := Explain(f)
		i := slices.IndexFunc(e.Steps, func(s Step) bool { return s.Name == "congestion control" })
		switch {
		case cc == "" && i >= 0:
			t.Errorf("a rule that leaves the pod's congestion control has a step for it: %+v", e.Steps[i])
		case cc != "" && (i < 0 || !strings.Contains(e.Steps[i].Detail, want) || e.Steps[i].Cause != ""):
			t.Errorf("%s: steps %+v, want a congestion control step saying %q, no cause", cc, e.Steps, want)
		}
	}
}

// facts answer: the steps that need what was not read say so and why, the
// walk goes on, and no cause is made up from what was not read.
func TestUnreadFactsAreNamedAndTheWalkGoesOn(t *testing.T) {
	const forbidden = `mptcpnodestates.mptcp.io "n1" is forbidden: User "alice" cannot get resource "mptcpnodestates"`
	noState := func(f *Facts) { f.NodeState, f.NodeStateError = nil, forbidden }
	for _, tc := range []struct {
		name       string
		change     func(*Facts)
		causes     []Cause
		unread     []string
		wantSteps  []string
		detailHas  string
		detailStep string
	}{
		{"node state forbidden", noState, nil, []string{"selection"}, []string{"selection", "gate", "connections"}, "forbidden", "selection"},
		{"node state forbidden, gate false", func(f *Facts) {
			noState(f)
			f.Pod.Status.Conditions[0].Status = corev1.ConditionFalse
		}, []Cause{CauseGateNotReady}, []string{"selection"}, []string{"gate"}, "", ""},
		{"node state forbidden, a fallback counted", func(f *Facts) {
			noState(f)
			f.Agent.Counters["MPCapableFallbackACK"] = 1
		}, []Cause{CauseFallback}, []string{"selection"}, []string{"fallback"}, "", ""},
		{"node state forbidden, path manager down", func(f *Facts) {
			noState(f)
			f.Agent.PathManager.Up = false
		}, []Cause{CausePathManagerDown}, []string{"selection"}, nil, "", ""},
		{"node state and exec forbidden", func(f *Facts) {
			noState(f)
			f.Agent, f.AgentError = nil, `pods "mptcp-agent-x" is forbidden: User "alice" cannot create resource "pods/exec"`
		}, nil, []string{"selection", "agent data"}, []string{"gate"}, "pods/exec", "agent data"},
		{"exec forbidden", func(f *Facts) { f.Agent, f.AgentError = nil, "forbidden" }, nil, []string{"agent data"}, []string{"path state"}, "", ""},
		{"policies forbidden for an unselected pod", func(f *Facts) {
			f.NodeState.Spec.Pods = nil
			f.Policies, f.PoliciesError = nil, `mptcppolicies.mptcp.io is forbidden`
		}, []Cause{CauseNotSelected}, nil, nil, "MPTCPPolicies not read (mptcppolicies.mptcp.io is forbidden)", "selection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := healthy()
			tc.change(&f)
			e := Explain(f)
			if !slices.Equal(e.Causes, tc.causes) && (len(e.Causes) != 0 || len(tc.causes) != 0) {
				t.Errorf("causes %v, want %v; steps %+v", e.Causes, tc.causes, e.Steps)
			}
			if !slices.Equal(e.Unread, tc.unread) {
				t.Errorf("unread %v, want %v; steps %+v", e.Unread, tc.unread, e.Steps)
			}
			for _, name := range tc.wantSteps {
				if !slices.ContainsFunc(e.Steps, func(s Step) bool { return s.Name == name }) {
					t.Errorf("no step %q: the walk stopped at what it could not read; steps %+v", name, e.Steps)
				}
			}
			for _, s := range e.Steps {
				if s.Unread != slices.Contains(tc.unread, s.Name) {
					t.Errorf("step %s marked unread %v", s.Name, s.Unread)
				}
				if s.Name == "verdict" && len(tc.unread) > 0 {
					t.Errorf("a verdict of nothing found while %v was not read: %s", tc.unread, s.Detail)
				}
				if s.Name == tc.detailStep && !strings.Contains(s.Detail, tc.detailHas) {
					t.Errorf("step %s says %q, want it to say why (%q)", s.Name, s.Detail, tc.detailHas)
				}
			}
		})
	}
}
