package controller_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/kube"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// recordingEnforcer stands in for the datapath: it keeps the plans the
// reconciler enforces, and fails to configure the pods of fail
// (namespace/name), as the agent reports a pod it could not configure.
type recordingEnforcer struct {
	mu    sync.Mutex
	plans []*agent.Plan
	fail  map[string]bool
}

func (e *recordingEnforcer) Reconcile(_ context.Context, p *agent.Plan) ([]mptcpv1alpha1.PodProblem, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var failed []mptcpv1alpha1.PodProblem
	p.Pods = slices.DeleteFunc(p.Pods, func(pod agent.PlanPod) bool {
		if !e.fail[pod.Ref.Namespace+"/"+pod.Ref.Name] {
			return false
		}
		failed = append(failed, mptcpv1alpha1.PodProblem{Namespace: pod.Ref.Namespace, Name: pod.Ref.Name,
			Reason: mptcpv1alpha1.PodConfigureFailed, Message: "its network namespace is gone"})
		return true
	})
	e.plans = append(e.plans, p)
	return failed, nil
}
func (e *recordingEnforcer) Prior() (agent.Prior, error)                 { return agent.Prior{}, nil }
func (e *recordingEnforcer) FinishMigration(error) error                 { return nil }
func (e *recordingEnforcer) WriteStatus(agent.Status) error              { return nil }
func (e *recordingEnforcer) Attachments() ([]datapath.Attachment, error) { return nil, nil }
func (e *recordingEnforcer) SocketMPTCP() agent.SocketMPTCP              { return agent.SocketMPTCP{} }
func (e *recordingEnforcer) TCPListeners(agent.PlanPod) ([]netip.AddrPort, error) {
	return nil, nil
}
func (e *recordingEnforcer) Unenforced() []agent.Problem       { return nil }
func (e *recordingEnforcer) Checks() []mptcpv1alpha1.NodeCheck { return nil }

func (e *recordingEnforcer) PathLiveness(uint32) mptcpv1alpha1.Liveness {
	return mptcpv1alpha1.LivenessUnknown
}

// enforcedPods are the pods of the last plan, as namespace/name.
func (e *recordingEnforcer) enforcedPods() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.plans) == 0 {
		return nil
	}
	var out []string
	for _, p := range e.plans[len(e.plans)-1].Pods {
		out = append(out, p.Ref.Namespace+"/"+p.Ref.Name)
	}
	return out
}

// runAgentReconciler runs the agent's kube reconciler for node n1 until the
// test ends, as kube.Run builds it: with n1's pod-bound token (the agent's
// pod is created; config/agent's RBAC and admission policies must be
// applied), its cache holding n1's node state only. enforcer stands in for
// the datapath; the node has one link, nic1, and a pod is the veth named
// for its address. wrap, unless nil, wraps the manager's client as the
// reconciler's.
func runAgentReconciler(t *testing.T, env *testenv.Env, enforcer kube.Enforcer, resync time.Duration, wrap func(client.Client) client.Client) {
	t.Helper()
	token := env.PodToken(t, createAgentPod(t, env, "n1"))
	mgr, err := ctrl.NewManager(env.AsToken(token), ctrl.Options{
		Scheme: env.Scheme, Cache: kube.CacheOptions("n1"),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		// Tests of this package start agents' controllers of the same
		// name in one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := mgr.GetClient()
	if wrap != nil {
		c = wrap(c)
	}
	log := slog.New(slog.DiscardHandler)
	r := &kube.Reconciler{
		Client: c, APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("mptcp-agent"),
		Agent: enforcer, Settings: agent.NodeDefaults("n1"), Node: "n1", Log: log, Metrics: observe.NewMetrics(nil, log),
		Resync: resync,
		Links: func() ([]agent.NodeLink, error) {
			return []agent.NodeLink{{Name: "nic1", Up: true, Addresses: []netip.Prefix{netip.MustParsePrefix("10.101.1.2/24")},
				Gateway: netip.MustParseAddr("10.101.1.1")}}, nil
		},
		Locate: func(ips []netip.Addr) (agent.LocatedPod, error) {
			return agent.LocatedPod{HostInterface: "veth-" + ips[0].String(), NetNS: "/var/run/netns/" + ips[0].String()}, nil
		},
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

// TestAgentSkipsAndReportsABadPodAndEnforcesTheRest runs the agent's kube
// reconciler (its datapath stood in for) with node n1's pod-bound token and
// config/agent's RBAC and admission policies against a real API server. Its
// node state holds a pod of tenant-b whose rule names a path no node has,
// next to a pod of tenant-a: tenant-a's pod is enforced and gated, and so is
// a new pod of tenant-a added later; tenant-b's pod is listed in status.pods
// and its gate is False with the reason; the node is Ready and not Degraded.
// A pod of tenant-c that the agent fails to configure (its namespace gone
// between locate and configure) is reported and gated False the same way
// (ConfigureFailed), and does not keep tenant-a's pods from their gates.
// Rejecting the whole node state instead would enforce nothing and gate no
// pod.
func TestAgentSkipsAndReportsABadPodAndEnforcesTheRest(t *testing.T) {
	env := testenv.Start(t, testenv.ServiceAccountTokens())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env.Namespace(t, agentNamespace, nil)
	applyDir(t, env.Client, filepath.Join(testenv.RepoRoot(), "config", "agent"))
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}); err != nil {
		t.Fatal(err)
	}
	newPod := func(ns, name, ip string) mptcpv1alpha1.NodePod {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/c"}}},
		}
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return mptcpv1alpha1.NodePod{Namespace: ns, Name: name, UID: string(p.UID), IPs: []string{ip}}
	}
	env.Namespace(t, "tenant-a", nil)
	env.Namespace(t, "tenant-b", nil)
	web := newPod("tenant-a", "web", "10.244.1.10")
	web.Rules = []string{"good"}
	bad := newPod("tenant-b", "bad", "10.244.1.20")
	bad.Rules = []string{"nowhere"}
	env.Namespace(t, "tenant-c", nil)
	flaky := newPod("tenant-c", "flaky", "10.244.1.30")
	flaky.Rules = []string{"good"}

	rule := func(name string, path string) mptcpv1alpha1.CompiledRule {
		return mptcpv1alpha1.CompiledRule{Name: name, Policy: name, PolicyGeneration: 1, MaxSubflows: 2, SpreadMode: mptcpv1alpha1.SpreadRoundRobin,
			SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace, Paths: []mptcpv1alpha1.RulePath{{Name: path, Weight: 1}}}
	}
	state := &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: mptcpv1alpha1.MPTCPNodeStateSpec{
		PodCIDRs: []string{"10.244.1.0/24"},
		Paths: []mptcpv1alpha1.NodePath{{Name: "fabric-a", Index: 1, Interface: mptcpv1alpha1.InterfaceSelector{Name: "nic1"},
			Capacity: resource.MustParse("1G")}},
		Rules: []mptcpv1alpha1.CompiledRule{rule("good", "fabric-a"), rule("nowhere", "fabric-z")},
		Pods:  []mptcpv1alpha1.NodePod{web, bad, flaky},
	}}
	if err := env.Client.Create(ctx, state); err != nil {
		t.Fatal(err)
	}

	enforcer := &recordingEnforcer{fail: map[string]bool{"tenant-c/flaky": true}}
	runAgentReconciler(t, env, enforcer, time.Second, nil)

	gate := func(ns, name string) (corev1.PodCondition, error) {
		var p corev1.Pod
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &p); err != nil {
			return corev1.PodCondition{}, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == kube.PodReadyCondition {
				return c, nil
			}
		}
		return corev1.PodCondition{}, fmt.Errorf("%s/%s has no gate condition", ns, name)
	}
	gatedTrue := func(ns, name string) error {
		c, err := gate(ns, name)
		if err == nil && c.Status != corev1.ConditionTrue {
			err = fmt.Errorf("%s/%s gate %s (%s)", ns, name, c.Status, c.Reason)
		}
		return err
	}

	testutil.Eventually(t, 15*time.Second, 100*time.Millisecond, "tenant-a's pod enforced and gated", func() error {
		if got := enforcer.enforcedPods(); !slices.Equal(got, []string{"tenant-a/web"}) {
			return fmt.Errorf("enforced pods %v", got)
		}
		return gatedTrue("tenant-a", "web")
	})
	testutil.Eventually(t, 15*time.Second, 100*time.Millisecond, "tenant-b's pod reported in status, the node Ready and not Degraded", func() error {
		var s mptcpv1alpha1.MPTCPNodeState
		if err := env.Client.Get(ctx, types.NamespacedName{Name: "n1"}, &s); err != nil {
			return err
		}
		if len(s.Status.Pods) != 2 || s.Status.SkippedPods != 2 {
			return fmt.Errorf("status.pods %+v, skippedPods %d", s.Status.Pods, s.Status.SkippedPods)
		}
		if p := s.Status.Pods[1]; p.Namespace != "tenant-c" || p.Name != "flaky" || p.Reason != mptcpv1alpha1.PodConfigureFailed {
			return fmt.Errorf("status.pods %+v", p)
		}
		if p := s.Status.Pods[0]; p.Namespace != "tenant-b" || p.Name != "bad" || p.Reason != mptcpv1alpha1.PodRuleUnusable ||
			!strings.Contains(p.Message, "fabric-z") {
			return fmt.Errorf("status.pods %+v", p)
		}
		if len(s.Status.Errors) != 0 {
			return fmt.Errorf("node errors %v", s.Status.Errors)
		}
		d := meta.FindStatusCondition(s.Status.Conditions, kube.ConditionDegraded)
		if d == nil || d.Status != metav1.ConditionFalse || d.Reason != kube.ReasonPodsSkipped {
			return fmt.Errorf("Degraded %+v", d)
		}
		if !meta.IsStatusConditionTrue(s.Status.Conditions, kube.ConditionReady) {
			return fmt.Errorf("not Ready: %+v", s.Status.Conditions)
		}
		return nil
	})
	testutil.Eventually(t, 15*time.Second, 100*time.Millisecond, "tenant-b's pod gate False with the reason", func() error {
		c, err := gate("tenant-b", "bad")
		if err != nil {
			return err
		}
		if c.Status != corev1.ConditionFalse || c.Reason != string(mptcpv1alpha1.PodRuleUnusable) || !strings.Contains(c.Message, "fabric-z") {
			return fmt.Errorf("gate %+v", c)
		}
		return nil
	})

	testutil.Eventually(t, 15*time.Second, 100*time.Millisecond, "tenant-c's pod gate False with ConfigureFailed", func() error {
		c, err := gate("tenant-c", "flaky")
		if err != nil {
			return err
		}
		if c.Status != corev1.ConditionFalse || c.Reason != string(mptcpv1alpha1.PodConfigureFailed) {
			return fmt.Errorf("gate %+v", c)
		}
		return nil
	})

	// A new pod of tenant-a, while tenant-b's pod is still bad: configured
	// and gated, not held by tenant-b's problem.
	web2 := newPod("tenant-a", "web2", "10.244.1.11")
	web2.Rules = []string{"good"}
	if err := env.Client.Get(ctx, types.NamespacedName{Name: "n1"}, state); err != nil {
		t.Fatal(err)
	}
	state.Spec.Pods = []mptcpv1alpha1.NodePod{web, web2, bad, flaky}
	if err := env.Client.Update(ctx, state); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, 100*time.Millisecond, "tenant-a's new pod enforced and gated", func() error {
		if got := enforcer.enforcedPods(); !slices.Equal(got, []string{"tenant-a/web", "tenant-a/web2"}) {
			return fmt.Errorf("enforced pods %v", got)
		}
		return gatedTrue("tenant-a", "web2")
	})
}
