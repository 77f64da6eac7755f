package controller_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/compile"
	controllermetrics "github.com/mptcp-operator/mptcp-operator/internal/controller/metrics"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

var (
	multipath = map[string]string{"multipath": "true"}
	enabled   = map[string]string{"tenant": "enabled"}
	web       = map[string]string{"app": "web"}
)

// twoFabrics is the common cluster: nodes n1 and n2, each with nic1 on
// fabric-a and nic2 on fabric-b, and the tenant namespace tenant-a.
func twoFabrics(f *fixture) {
	f.node("n1", multipath, "10.1.1.0/24")
	f.node("n2", multipath, "10.1.2.0/24")
	f.path("fabric-a", "nic1", multipath, mptcpv1alpha1.PathRoleActive)
	f.path("fabric-b", "nic2", multipath, mptcpv1alpha1.PathRoleActive)
	f.namespace("tenant-a", enabled)
}

func allowPreferences(s *mptcpv1alpha1.MPTCPPolicySpec) {
	s.TenantPreferences = mptcpv1alpha1.Allowed
}

// step is one change to the cluster and what the node states must then say.
type step struct {
	do    func(f *fixture)               // change made, as an admin, a tenant, kubelet or an agent would
	want  map[string][]string            // node -> pod summaries (see fixture.summary); nil slice: no node state
	check func(t *testing.T, f *fixture) // further assertions: events, status
}

// TestCompile runs the controller against a real API server and checks what
// it compiles into node states as the cluster changes.
func TestCompile(t *testing.T) {
	env := testenv.Start(t)
	// With only the generated RBAC: a missing marker fails these cases.
	testenv.StartManagerWith(t, env, env.AsController(t))

	cases := map[string]struct {
		setup func(f *fixture) // cluster before the first step
		steps []step           // in order
	}{
		"a policy spreads a pod over both fabrics with weights": {
			setup: twoFabrics,
			steps: []step{{
				do: func(f *fixture) {
					f.policy("spread", 0, enabled, nil, []string{"fabric-a=2", "fabric-b"}, nil)
					f.pod("tenant-a", "web", "n1", "10.1.1.10", web, nil)
				},
				want: map[string][]string{
					"n1": {"tenant-a/web 10.1.1.10: spread[fabric-a/2,fabric-b/1]"},
					"n2": {},
				},
				check: func(t *testing.T, f *fixture) {
					pol := &mptcpv1alpha1.MPTCPPolicy{ObjectMeta: metav1.ObjectMeta{Name: f.n("spread")}}
					conds := func() []metav1.Condition { return pol.Status.Conditions }
					f.condition(pol, conds, mptcpv1alpha1.ConditionProgressing, metav1.ConditionTrue, "waiting for "+f.n("n1"))
					f.condition(pol, conds, mptcpv1alpha1.ConditionReady, metav1.ConditionFalse, "applied on 0 of 1 nodes")
					if pol.Status.MatchedPods != 1 || pol.Status.Nodes != 1 || pol.Status.NodesReady != 0 {
						t.Fatalf("status before the agent applied: %+v", pol.Status)
					}
					f.applyAll("n1")
					f.condition(pol, conds, mptcpv1alpha1.ConditionReady, metav1.ConditionTrue, "applied on all 1 nodes")
					// kubectl describe mptcppolicy shows it.
					f.expectObjectEventOfType("MPTCPPolicy", f.n("spread"), "Applied", corev1.EventTypeNormal)
				},
			}},
		},
		"overlapping policies are ordered by priority then name": {
			setup: twoFabrics,
			steps: []step{{
				do: func(f *fixture) {
					f.policy("beta", 0, enabled, nil, []string{"fabric-a"}, nil)
					f.policy("alpha", 0, enabled, nil, []string{"fabric-b"}, nil)
					f.policy("high", 10, enabled, web, []string{"fabric-b", "fabric-a"}, nil)
					f.pod("tenant-a", "web", "n1", "10.1.1.10", web, nil)
					f.pod("tenant-a", "db", "n1", "10.1.1.11", nil, nil)
				},
				want: map[string][]string{"n1": {
					"tenant-a/db 10.1.1.11: alpha[fabric-b/1]; beta[fabric-a/1]",
					"tenant-a/web 10.1.1.10: high[fabric-b/1,fabric-a/1]; alpha[fabric-b/1]; beta[fabric-a/1]",
				}},
			}, {
				do: func(f *fixture) {
					f.changePolicy("beta", func(s *mptcpv1alpha1.MPTCPPolicySpec) { s.Priority = 20 })
				},
				want: map[string][]string{"n1": {
					"tenant-a/db 10.1.1.11: beta[fabric-a/1]; alpha[fabric-b/1]",
					"tenant-a/web 10.1.1.10: beta[fabric-a/1]; high[fabric-b/1,fabric-a/1]; alpha[fabric-b/1]",
				}},
			}},
		},
		"namespace label changes add and remove its pods": {
			setup: func(f *fixture) {
				twoFabrics(f)
				f.namespace("tenant-b", nil)
				f.policy("spread", 0, enabled, nil, []string{"fabric-a"}, nil)
				f.pod("tenant-b", "web", "n1", "10.1.1.20", nil, nil)
			},
			steps: []step{
				{want: map[string][]string{"n1": {}}},
				{
					do:   func(f *fixture) { f.labelNamespace("tenant-b", enabled) },
					want: map[string][]string{"n1": {"tenant-b/web 10.1.1.20: spread[fabric-a/1]"}},
				},
				{
					do:   func(f *fixture) { f.labelNamespace("tenant-b", map[string]string{"tenant": "disabled"}) },
					want: map[string][]string{"n1": {}},
				},
			},
		},
		"pods created, moved to another node and deleted": {
			setup: func(f *fixture) {
				twoFabrics(f)
				f.policy("spread", 0, enabled, nil, []string{"fabric-a", "fabric-b"}, nil)
			},
			steps: []step{
				{
					do: func(f *fixture) { f.pod("tenant-a", "web", "n1", "10.1.1.10", web, nil) },
					want: map[string][]string{
						"n1": {"tenant-a/web 10.1.1.10: spread[fabric-a/1,fabric-b/1]"},
						"n2": {},
					},
				},
				{
					do: func(f *fixture) {
						f.deletePod("tenant-a", "web")
						f.pod("tenant-a", "web", "n2", "10.1.2.10", web, nil)
					},
					want: map[string][]string{
						"n1": {},
						"n2": {"tenant-a/web 10.1.2.10: spread[fabric-a/1,fabric-b/1]"},
					},
				},
				{
					do:   func(f *fixture) { f.deletePod("tenant-a", "web") },
					want: map[string][]string{"n1": {}, "n2": {}},
				},
			},
		},
		"a deleted node's state is deleted": {
			setup: func(f *fixture) {
				twoFabrics(f)
				f.policy("spread", 0, enabled, nil, []string{"fabric-a"}, nil)
				f.pod("tenant-a", "web", "n2", "10.1.2.10", nil, nil)
			},
			steps: []step{
				{want: map[string][]string{"n1": {}, "n2": {"tenant-a/web 10.1.2.10: spread[fabric-a/1]"}}},
				{
					do:   func(f *fixture) { f.deleteNode("n2") },
					want: map[string][]string{"n1": {}, "n2": nil},
				},
			},
		},
		"a path missing on a node is left out and reported": {
			setup: func(f *fixture) {
				f.node("n1", map[string]string{"multipath": "true", "fabric-b": "yes"}, "10.1.1.0/24")
				f.node("n2", multipath, "10.1.2.0/24")
				f.path("fabric-a", "nic1", multipath, mptcpv1alpha1.PathRoleActive)
				f.path("fabric-b", "nic2", map[string]string{"fabric-b": "yes"}, mptcpv1alpha1.PathRoleActive)
				f.namespace("tenant-a", enabled)
				f.policy("spread", 0, enabled, nil, []string{"fabric-a", "fabric-b"}, nil)
				f.pod("tenant-a", "web", "n2", "10.1.2.10", nil, nil)
			},
			steps: []step{{
				want: map[string][]string{"n1": {}, "n2": {"tenant-a/web 10.1.2.10: spread[fabric-a/1]"}},
				check: func(t *testing.T, f *fixture) {
					pol := &mptcpv1alpha1.MPTCPPolicy{ObjectMeta: metav1.ObjectMeta{Name: f.n("spread")}}
					f.condition(pol, func() []metav1.Condition { return pol.Status.Conditions },
						mptcpv1alpha1.ConditionDegraded, metav1.ConditionTrue, "paths "+f.n("fabric-b")+" do not exist on nodes "+f.n("n2"))
					f.expectObjectEvent("MPTCPPolicy", f.n("spread"), "PathNotOnNode")
				},
			}, {
				// The agent on n2 finds no nic1.
				do: func(f *fixture) {
					f.report("n2", mptcpv1alpha1.PathState{Name: "fabric-a", Link: mptcpv1alpha1.LinkNotFound, Message: "no interface named nic1"})
				},
				check: func(t *testing.T, f *fixture) {
					path := &mptcpv1alpha1.MPTCPPath{ObjectMeta: metav1.ObjectMeta{Name: f.n("fabric-a")}}
					f.condition(path, func() []metav1.Condition { return path.Status.Conditions },
						mptcpv1alpha1.ConditionDegraded, metav1.ConditionTrue, "no matching interface on 1 nodes: "+f.n("n2"))
					if got := path.Status.NodesWithoutInterface; len(got) != 1 || got[0] != f.n("n2") {
						t.Fatalf("nodesWithoutInterface = %v", got)
					}
					pol := &mptcpv1alpha1.MPTCPPolicy{ObjectMeta: metav1.ObjectMeta{Name: f.n("spread")}}
					f.condition(pol, func() []metav1.Condition { return pol.Status.Conditions },
						mptcpv1alpha1.ConditionDegraded, metav1.ConditionTrue, "no matching interface for "+f.n("n2")+"/"+f.n("fabric-a"))
				},
			}},
		},
		"two paths naming one interface: the older keeps it, the other is reported": {
			setup: func(f *fixture) {
				twoFabrics(f)
				// fabric-c, created after fabric-a, names nic1 too.
				f.node("n3", map[string]string{"multipath": "true"}, "10.1.3.0/24")
				f.path("fabric-c", "nic1", map[string]string{"multipath": "true"}, mptcpv1alpha1.PathRoleActive)
				f.policy("spread", 0, enabled, nil, []string{"fabric-a", "fabric-b", "fabric-c"}, nil)
				f.pod("tenant-a", "web", "n1", "10.1.1.10", nil, nil)
			},
			steps: []step{{
				want: map[string][]string{"n1": {"tenant-a/web 10.1.1.10: spread[fabric-a/1,fabric-b/1]"}, "n2": {}, "n3": {}},
				check: func(t *testing.T, f *fixture) {
					path := &mptcpv1alpha1.MPTCPPath{ObjectMeta: metav1.ObjectMeta{Name: f.n("fabric-c")}}
					msg := "interface nic1 is also path " + f.n("fabric-a") + "'s, which is older and keeps it: this path is left out on 3 nodes"
					f.condition(path, func() []metav1.Condition { return path.Status.Conditions },
						mptcpv1alpha1.ConditionDegraded, metav1.ConditionTrue, msg)
					f.condition(path, func() []metav1.Condition { return path.Status.Conditions },
						mptcpv1alpha1.ConditionReady, metav1.ConditionFalse, msg)
					f.expectObjectEvent("MPTCPPath", f.n("fabric-c"), "InterfaceConflict")
					older := &mptcpv1alpha1.MPTCPPath{ObjectMeta: metav1.ObjectMeta{Name: f.n("fabric-a")}}
					f.condition(older, func() []metav1.Condition { return older.Status.Conditions },
						mptcpv1alpha1.ConditionDegraded, metav1.ConditionFalse, "")
					pol := &mptcpv1alpha1.MPTCPPolicy{ObjectMeta: metav1.ObjectMeta{Name: f.n("spread")}}
					f.condition(pol, func() []metav1.Condition { return pol.Status.Conditions },
						mptcpv1alpha1.ConditionDegraded, metav1.ConditionTrue, f.n("fabric-c"))
				},
			}},
		},
		"node labels and path deletion change which paths a node has": {
			setup: func(f *fixture) {
				twoFabrics(f)
				f.policy("spread", 0, enabled, nil, []string{"fabric-a", "fabric-b"}, nil)
				f.pod("tenant-a", "web", "n1", "10.1.1.10", nil, nil)
			},
			steps: []step{
				{want: map[string][]string{"n1": {"tenant-a/web 10.1.1.10: spread[fabric-a/1,fabric-b/1]"}}},
				{
					// n1 leaves the multipath nodes: no path selects it any more.
					do: func(f *fixture) {
						var n corev1.Node
						f.must(f.c.Get(f.ctx, types.NamespacedName{Name: f.n("n1")}, &n), "get node")
						n.Labels = f.caseLabels(nil)
						f.must(f.c.Update(f.ctx, &n), "relabel node")
					},
					want: map[string][]string{"n1": {"tenant-a/web 10.1.1.10: spread[]"}},
				},
				{
					do: func(f *fixture) {
						var n corev1.Node
						f.must(f.c.Get(f.ctx, types.NamespacedName{Name: f.n("n1")}, &n), "get node")
						n.Labels = f.caseLabels(multipath)
						f.must(f.c.Update(f.ctx, &n), "relabel node")
						f.must(f.c.Delete(f.ctx, &mptcpv1alpha1.MPTCPPath{ObjectMeta: metav1.ObjectMeta{Name: f.n("fabric-b")}}), "delete path")
					},
					want: map[string][]string{"n1": {"tenant-a/web 10.1.1.10: spread[fabric-a/1]"}},
					check: func(t *testing.T, f *fixture) {
						var s mptcpv1alpha1.MPTCPNodeState
						f.must(f.c.Get(f.ctx, types.NamespacedName{Name: f.n("n1")}, &s), "get node state")
						if len(s.Spec.Paths) != 1 || s.Spec.Paths[0].Name != f.n("fabric-a") {
							t.Fatalf("node paths after deleting fabric-b: %+v", s.Spec.Paths)
						}
						pol := &mptcpv1alpha1.MPTCPPolicy{ObjectMeta: metav1.ObjectMeta{Name: f.n("spread")}}
						f.condition(pol, func() []metav1.Condition { return pol.Status.Conditions },
							mptcpv1alpha1.ConditionDegraded, metav1.ConditionTrue, "paths "+f.n("fabric-b")+" do not exist")
					},
				},
			},
		},
		"a tenant preference is honoured where the policy allows it": {
			setup: func(f *fixture) {
				twoFabrics(f)
				f.policy("spread", 0, enabled, nil, []string{"fabric-a=2", "fabric-b"}, allowPreferences)
				f.pod("tenant-a", "web", "n1", "10.1.1.10", nil, nil)
			},
			steps: []step{
				{want: map[string][]string{"n1": {"tenant-a/web 10.1.1.10: spread[fabric-a/2,fabric-b/1]"}}},
				{
					do: func(f *fixture) {
						f.annotatePod("tenant-a", "web", map[string]string{mptcpv1alpha1.AnnotationPreferredPaths: " " + f.n("fabric-b") + " "})
					},
					want:  map[string][]string{"n1": {"tenant-a/web 10.1.1.10: spread[fabric-b/1,fabric-a/2]+pref"}},
					check: func(t *testing.T, f *fixture) { f.expectNoEvent("tenant-a", "web") },
				},
			},
		},
		"a pod its node's agent skips gets a Warning event from the controller": {
			setup: func(f *fixture) {
				twoFabrics(f)
				f.policy("spread", 0, enabled, nil, []string{"fabric-a"}, nil)
				f.pod("tenant-a", "web", "n1", "10.1.1.10", nil, nil)
			},
			steps: []step{{
				want: map[string][]string{"n1": {"tenant-a/web 10.1.1.10: spread[fabric-a/1]"}},
				check: func(t *testing.T, f *fixture) {
					// The agent may not write events about pods
					// (admission cannot tie a pod's event to its node);
					// it reports them in status.pods, and the controller
					// writes the event.
					f.agentStatus("n1", func(st *mptcpv1alpha1.MPTCPNodeStateStatus) {
						st.Pods = []mptcpv1alpha1.PodProblem{{Namespace: f.n("tenant-a"), Name: "web",
							Reason: mptcpv1alpha1.PodNotFound, Message: "no route"}}
						st.SkippedPods = 1
					})
					f.expectEvent("tenant-a", "web", string(mptcpv1alpha1.PodNotFound))
				},
			}},
		},
		"the controller's metrics count the node states an agent reports Degraded, and each compile": {
			setup: func(f *fixture) {
				twoFabrics(f)
				f.policy("spread", 0, enabled, nil, []string{"fabric-a", "fabric-b"}, nil)
				f.pod("tenant-a", "web", "n1", "10.1.1.10", nil, nil)
			},
			steps: []step{{
				want: map[string][]string{"n1": {"tenant-a/web 10.1.1.10: spread[fabric-a/1,fabric-b/1]"}},
				check: func(t *testing.T, f *fixture) {
					compiles := histogramCount(t, controllermetrics.CompileDuration)
					if compiles < 2 {
						t.Errorf("compile_duration_seconds counted %d compiles, want at least both nodes'", compiles)
					}
					elected := make(chan struct{})
					objects := controllermetrics.NewObjects(f.c, elected)
					if n := testutil.CollectAndCount(objects); n != 0 {
						t.Errorf("a replica not elected reports %d series, want none (the leader's alone count)", n)
					}
					close(elected)
					degraded := func() float64 {
						return gathered(t, objects, "mptcp_controller_node_state_degraded", map[string]string{"node": f.n("n1"), "reason": "InterfaceMissing"})
					}
					if v := degraded(); v != 0 {
						t.Errorf("node_state_degraded for n1 before its agent reported: %v", v)
					}
					f.agentStatus("n1", func(st *mptcpv1alpha1.MPTCPNodeStateStatus) {
						meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: mptcpv1alpha1.ConditionDegraded, Status: metav1.ConditionTrue,
							Reason: "InterfaceMissing", Message: "fabric-b: no interface nic2"})
					})
					if v := degraded(); v != 1 {
						t.Errorf("node_state_degraded{node=n1,reason=InterfaceMissing} = %v, want 1", v)
					}
					if v := gathered(t, objects, "mptcp_controller_node_states", map[string]string{"condition": "Degraded", "status": "True"}); v < 1 {
						t.Errorf("node_states{condition=Degraded,status=True} = %v, want n1 counted", v)
					}
					if v := gathered(t, objects, "mptcp_controller_policies", map[string]string{"condition": "Ready", "status": "Unknown"}) +
						gathered(t, objects, "mptcp_controller_policies", map[string]string{"condition": "Ready", "status": "False"}) +
						gathered(t, objects, "mptcp_controller_policies", map[string]string{"condition": "Ready", "status": "True"}); v < 1 {
						t.Errorf("policies by Ready: %v in all, want the case's policy counted", v)
					}
				},
			}},
		},
		"a tenant preference is refused where the policy forbids it": {
			setup: func(f *fixture) {
				twoFabrics(f)
				f.policy("spread", 0, enabled, nil, []string{"fabric-a", "fabric-b"}, nil)
				f.pod("tenant-a", "web", "n1", "10.1.1.10", nil, nil)
			},
			steps: []step{{
				do: func(f *fixture) {
					f.annotatePod("tenant-a", "web", map[string]string{mptcpv1alpha1.AnnotationPreferredPaths: f.n("fabric-b")})
				},
				want:  map[string][]string{"n1": {"tenant-a/web 10.1.1.10: spread[fabric-a/1,fabric-b/1]"}},
				check: func(t *testing.T, f *fixture) { f.expectEvent("tenant-a", "web", compile.ReasonPreferencesForbidden) },
			}},
		},
		"a tenant preference for a path outside the policy is refused": {
			setup: func(f *fixture) {
				twoFabrics(f)
				f.path("fabric-c", "nic3", multipath, mptcpv1alpha1.PathRoleActive)
				f.policy("spread", 0, enabled, nil, []string{"fabric-a", "fabric-b"}, allowPreferences)
				f.pod("tenant-a", "web", "n1", "10.1.1.10", nil, nil)
			},
			steps: []step{{
				do: func(f *fixture) {
					f.annotatePod("tenant-a", "web", map[string]string{mptcpv1alpha1.AnnotationPreferredPaths: f.n("fabric-c") + "," + f.n("fabric-a")})
				},
				want:  map[string][]string{"n1": {"tenant-a/web 10.1.1.10: spread[fabric-a/1,fabric-b/1]"}},
				check: func(t *testing.T, f *fixture) { f.expectEvent("tenant-a", "web", compile.ReasonPreferencesOutside) },
			}},
		},
		"a tenant annotation cannot reach another namespace's pods": {
			setup: func(f *fixture) {
				twoFabrics(f)
				f.namespace("tenant-b", enabled)
				f.policy("spread", 0, enabled, nil, []string{"fabric-a", "fabric-b"}, allowPreferences)
				f.pod("tenant-a", "web", "n1", "10.1.1.10", nil, nil)
				f.pod("tenant-b", "db", "n1", "10.1.1.20", nil, nil)
			},
			steps: []step{{
				do: func(f *fixture) {
					f.annotatePod("tenant-a", "web", map[string]string{
						mptcpv1alpha1.AnnotationPreferredPaths: f.n("tenant-b") + "/db=" + f.n("fabric-b"),
					})
				},
				want: map[string][]string{"n1": {
					"tenant-a/web 10.1.1.10: spread[fabric-a/1,fabric-b/1]",
					"tenant-b/db 10.1.1.20: spread[fabric-a/1,fabric-b/1]",
				}},
				check: func(t *testing.T, f *fixture) {
					f.expectEvent("tenant-a", "web", compile.ReasonPreferencesInvalid)
					f.expectNoEvent("tenant-b", "db")
				},
			}, {
				// tenant-b's own preference still works, and only for its pod.
				do: func(f *fixture) {
					f.annotatePod("tenant-b", "db", map[string]string{mptcpv1alpha1.AnnotationPreferredPaths: f.n("fabric-b")})
				},
				want: map[string][]string{"n1": {
					"tenant-a/web 10.1.1.10: spread[fabric-a/1,fabric-b/1]",
					"tenant-b/db 10.1.1.20: spread[fabric-b/1,fabric-a/1]+pref",
				}},
				check: func(t *testing.T, f *fixture) {
					f.expectEvent("tenant-a", "web", compile.ReasonPreferencesInvalid)
					f.expectNoEvent("tenant-b", "db")
				},
			}},
		},
		"relabelling a pod does not lift its namespace's cap": {
			setup: func(f *fixture) {
				twoFabrics(f)
				// The admin caps tenant-a through its namespace's labels, and
				// offers a premium class that pods join by label.
				capped := map[string]string{"tenant": "enabled", "plan": "capped"}
				f.labelNamespace("tenant-a", capped)
				f.policy("tenant-cap", 0, capped, nil, []string{"fabric-a"}, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
					q := resource.MustParse("1G")
					s.RateLimits = &mptcpv1alpha1.RateLimits{Mode: mptcpv1alpha1.RateModePolice, PerPod: &q}
					s.MaxSubflows = 2
				})
				f.policy("premium", 100, enabled, map[string]string{"tier": "premium"}, []string{"fabric-b", "fabric-a"}, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
					s.MaxSubflows = 8
				})
				f.pod("tenant-a", "web", "n1", "10.1.1.10", web, nil)
			},
			steps: []step{{
				want: map[string][]string{"n1": {"tenant-a/web 10.1.1.10: tenant-cap[fabric-a/1|max:2|police perPod=1G]"}},
			}, {
				// The tenant relabels its pod into the premium class: it gets
				// the premium paths, under its namespace's caps.
				do: func(f *fixture) { f.labelPod("tenant-a", "web", map[string]string{"app": "web", "tier": "premium"}) },
				want: map[string][]string{"n1": {
					"tenant-a/web 10.1.1.10: premium[fabric-b/1,fabric-a/1|max:2|police perPod=1G]; tenant-cap[fabric-a/1|max:2|police perPod=1G]",
				}},
				check: func(t *testing.T, f *fixture) {
					f.expectEvent("tenant-a", "web", compile.ReasonCappedByNamespace)
				},
			}, {
				// Premium narrowed to part of the traffic: the cap keeps all
				// of its traffic, premium takes what the cap does not select.
				do: func(f *fixture) {
					f.changePolicy("premium", func(s *mptcpv1alpha1.MPTCPPolicySpec) {
						s.Traffic = &mptcpv1alpha1.TrafficMatch{CIDRs: []string{"10.50.0.0/16"}}
					})
				},
				want: map[string][]string{"n1": {
					"tenant-a/web 10.1.1.10: tenant-cap[fabric-a/1|max:2|police perPod=1G]; premium[fabric-b/1,fabric-a/1|max:8]",
				}},
			}, {
				// Only an admin lifts the cap: by the namespace's labels.
				do: func(f *fixture) { f.labelNamespace("tenant-a", enabled) },
				want: map[string][]string{"n1": {
					"tenant-a/web 10.1.1.10: premium[fabric-b/1,fabric-a/1|max:8]",
				}},
			}},
		},
		"backup and blocked paths are compiled, blocked only where the node has them": {
			setup: func(f *fixture) {
				twoFabrics(f)
				f.path("lte", "wwan0", multipath, mptcpv1alpha1.PathRoleBackup)
				f.policy("storage", 0, enabled, nil, []string{"fabric-a"}, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
					s.HeaderRewriting = mptcpv1alpha1.Allowed
					s.BackupPaths = []string{f.n("lte")}
					s.BlockedPaths = []string{f.n("fabric-b"), f.n("not-here")}
				})
				f.pod("tenant-a", "db", "n1", "10.1.1.10", nil, nil)
			},
			steps: []step{{
				want: map[string][]string{"n1": {"tenant-a/db 10.1.1.10: storage[fabric-a/1|backup:lte|blocked:fabric-b]"}},
			}},
		},
		// Peers' addresses go into their MPTCPPeers (the next case),
		// never onto a Node.
		"an agent's per-path addresses stay in its node state; no Node is written": {
			setup: func(f *fixture) {
				twoFabrics(f)
			},
			steps: []step{{
				want: map[string][]string{"n1": {}},
				check: func(t *testing.T, f *fixture) {
					var before corev1.Node
					f.must(f.c.Get(f.ctx, types.NamespacedName{Name: f.n("n1")}, &before), "get node")
					f.report("n1",
						mptcpv1alpha1.PathState{Name: "fabric-b", Link: mptcpv1alpha1.LinkUp, Interface: "nic2", Addresses: []string{"192.0.2.11"}},
						mptcpv1alpha1.PathState{Name: "fabric-a", Link: mptcpv1alpha1.LinkUp, Interface: "nic1", Addresses: []string{"198.51.100.11"}})
					testenv.WaitIdle(t, time.Second, 30*time.Second)
					var after corev1.Node
					f.must(f.c.Get(f.ctx, types.NamespacedName{Name: f.n("n1")}, &after), "get node")
					if after.ResourceVersion != before.ResourceVersion || len(after.Annotations) != 0 {
						t.Errorf("Node written after its agent reported addresses: resourceVersion %s -> %s, annotations %v",
							before.ResourceVersion, after.ResourceVersion, after.Annotations)
					}
				},
			}},
		},
		// Each node with pods probes the others with pods over the
		// paths they share (liveness): their addresses, as their agents
		// report them, are their MPTCPPeers. A node's new address is
		// its own peer's and node state's change alone: no other node
		// state or peer is written, whatever the number of nodes.
		"a node with pods and addresses is a peer, and its new address writes no other node's objects": {
			setup: twoFabrics,
			steps: []step{{
				do: func(f *fixture) {
					f.policy("spread", 0, enabled, nil, []string{"fabric-a", "fabric-b"}, nil)
					f.pod("tenant-a", "web", "n1", "10.1.1.10", web, nil)
					f.pod("tenant-a", "db", "n2", "10.1.2.10", web, nil)
				},
				want: map[string][]string{
					"n1": {"tenant-a/web 10.1.1.10: spread[fabric-a/1,fabric-b/1]"},
					"n2": {"tenant-a/db 10.1.2.10: spread[fabric-a/1,fabric-b/1]"},
				},
				check: func(t *testing.T, f *fixture) {
					f.report("n2",
						mptcpv1alpha1.PathState{Name: "fabric-b", Link: mptcpv1alpha1.LinkUp, Interface: "nic2", Addresses: []string{"192.0.2.12"}},
						mptcpv1alpha1.PathState{Name: "fabric-a", Link: mptcpv1alpha1.LinkUp, Interface: "nic1", Addresses: []string{"198.51.100.12", "not an address"}},
						mptcpv1alpha1.PathState{Name: "unshared", Link: mptcpv1alpha1.LinkUp, Interface: "nic9", Addresses: []string{"203.0.113.12"}})
					// n1 has reported nothing yet: it is no peer.
					f.expectPeers(map[string][]mptcpv1alpha1.PeerPath{"n2": {
						{Name: f.n("fabric-a"), Addresses: []string{"198.51.100.12"}},
						{Name: f.n("fabric-b"), Addresses: []string{"192.0.2.12"}},
					}})
					f.report("n1",
						mptcpv1alpha1.PathState{Name: "fabric-a", Link: mptcpv1alpha1.LinkUp, Interface: "nic1", Addresses: []string{"198.51.100.11"}},
						mptcpv1alpha1.PathState{Name: "fabric-b", Link: mptcpv1alpha1.LinkUp, Interface: "nic2", Addresses: []string{"192.0.2.11"}})
					n1 := []mptcpv1alpha1.PeerPath{{Name: f.n("fabric-a"), Addresses: []string{"198.51.100.11"}}, {Name: f.n("fabric-b"), Addresses: []string{"192.0.2.11"}}}
					f.expectPeers(map[string][]mptcpv1alpha1.PeerPath{"n1": n1, "n2": {
						{Name: f.n("fabric-a"), Addresses: []string{"198.51.100.12"}},
						{Name: f.n("fabric-b"), Addresses: []string{"192.0.2.12"}},
					}})
					testenv.WaitIdle(t, time.Second, 30*time.Second)
					versions := func() map[string]string {
						out := map[string]string{}
						peers, err := f.peers()
						f.must(err, "list peers")
						for n, p := range peers {
							out["peer "+n] = p.ResourceVersion
						}
						for _, n := range []string{"n1", "n2"} {
							var s mptcpv1alpha1.MPTCPNodeState
							f.must(f.c.Get(f.ctx, types.NamespacedName{Name: f.n(n)}, &s), "get node state")
							out["node state "+n] = s.ResourceVersion
						}
						return out
					}
					before := versions()
					f.report("n2",
						mptcpv1alpha1.PathState{Name: "fabric-a", Link: mptcpv1alpha1.LinkUp, Interface: "nic1", Addresses: []string{"198.51.100.22"}},
						mptcpv1alpha1.PathState{Name: "fabric-b", Link: mptcpv1alpha1.LinkUp, Interface: "nic2", Addresses: []string{"192.0.2.12"}})
					f.expectPeers(map[string][]mptcpv1alpha1.PeerPath{"n1": n1, "n2": {
						{Name: f.n("fabric-a"), Addresses: []string{"198.51.100.22"}},
						{Name: f.n("fabric-b"), Addresses: []string{"192.0.2.12"}},
					}})
					testenv.WaitIdle(t, time.Second, 30*time.Second)
					after := versions()
					for _, k := range []string{"peer n1", "node state n1"} {
						if after[k] != before[k] {
							t.Errorf("n2's new address wrote %s (resourceVersion %s -> %s)", k, before[k], after[k])
						}
					}
					// Without pods, n2 is no one's peer.
					f.deletePod("tenant-a", "db")
					f.expectPeers(map[string][]mptcpv1alpha1.PeerPath{"n1": n1})
				},
			}},
		},
		// A compromised agent writes what it likes into its own status:
		// the other nodes' fabric addresses, under its paths' names and
		// under names of no path. It is the node that sorts first and
		// whose state is the oldest, so no tie-break favours the others;
		// they reported first and keep their addresses.
		"a node that claims the other nodes' addresses changes no other node's peer": {
			setup: func(f *fixture) {
				f.node("n0", multipath, "10.1.0.0/24")
				twoFabrics(f)
			},
			steps: []step{{
				do: func(f *fixture) {
					f.policy("spread", 0, enabled, nil, []string{"fabric-a", "fabric-b"}, nil)
					f.pod("tenant-a", "evil", "n0", "10.1.0.10", web, nil)
					f.pod("tenant-a", "web", "n1", "10.1.1.10", web, nil)
					f.pod("tenant-a", "db", "n2", "10.1.2.10", web, nil)
				},
				want: map[string][]string{
					"n0": {"tenant-a/evil 10.1.0.10: spread[fabric-a/1,fabric-b/1]"},
					"n1": {"tenant-a/web 10.1.1.10: spread[fabric-a/1,fabric-b/1]"},
					"n2": {"tenant-a/db 10.1.2.10: spread[fabric-a/1,fabric-b/1]"},
				},
				check: func(t *testing.T, f *fixture) {
					own := func(a, b string) []mptcpv1alpha1.PathState {
						return []mptcpv1alpha1.PathState{
							{Name: "fabric-a", Link: mptcpv1alpha1.LinkUp, Interface: "nic1", Addresses: []string{a}},
							{Name: "fabric-b", Link: mptcpv1alpha1.LinkUp, Interface: "nic2", Addresses: []string{b}},
						}
					}
					peer := func(a, b string) []mptcpv1alpha1.PeerPath {
						return []mptcpv1alpha1.PeerPath{
							{Name: f.n("fabric-a"), Addresses: []string{a}},
							{Name: f.n("fabric-b"), Addresses: []string{b}},
						}
					}
					f.report("n1", own("198.51.100.11", "192.0.2.11")...)
					f.report("n2", own("198.51.100.12", "192.0.2.12")...)
					f.report("n0", own("198.51.100.10", "192.0.2.10")...)
					n0, n1, n2 := peer("198.51.100.10", "192.0.2.10"), peer("198.51.100.11", "192.0.2.11"), peer("198.51.100.12", "192.0.2.12")
					f.expectPeers(map[string][]mptcpv1alpha1.PeerPath{"n0": n0, "n1": n1, "n2": n2})
					testenv.WaitIdle(t, time.Second, 30*time.Second)

					// n0 claims n1's and n2's addresses on both paths and
					// on paths that do not exist, and none of its own.
					stolen := []mptcpv1alpha1.PathState{
						{Name: "fabric-a", Link: mptcpv1alpha1.LinkUp, Interface: "nic1", Addresses: []string{"198.51.100.11", "198.51.100.12"}},
						{Name: "fabric-b", Link: mptcpv1alpha1.LinkUp, Interface: "nic2", Addresses: []string{"192.0.2.11", "192.0.2.12"}},
					}
					for i := range 8 {
						stolen = append(stolen, mptcpv1alpha1.PathState{Name: fmt.Sprintf("made-up-%d", i), Link: mptcpv1alpha1.LinkUp,
							Addresses: []string{"198.51.100.11", "198.51.100.12", "192.0.2.11", "192.0.2.12"}})
					}
					f.report("n0", stolen...)
					testenv.WaitIdle(t, time.Second, 30*time.Second)
					f.expectPeers(map[string][]mptcpv1alpha1.PeerPath{"n1": n1, "n2": n2})

					// Nor can it list more paths than a node has.
					var s mptcpv1alpha1.MPTCPNodeState
					f.must(f.c.Get(f.ctx, types.NamespacedName{Name: f.n("n0")}, &s), "get n0")
					s.Status.Paths = nil
					for i := range mptcpv1alpha1.MaxPathIndex + 1 {
						s.Status.Paths = append(s.Status.Paths, mptcpv1alpha1.PathState{Name: fmt.Sprintf("p%d", i), Link: mptcpv1alpha1.LinkUp})
					}
					if err := f.c.Status().Update(f.ctx, &s); !apierrors.IsInvalid(err) {
						t.Errorf("status with %d paths: %v, want Invalid", len(s.Status.Paths), err)
					}
				},
			}},
		},
	}

	id := 0
	for name, tc := range cases {
		id++
		f := newFixture(t, env, id)
		t.Run(name, func(t *testing.T) {
			f.t = t
			tc.setup(f)
			for i, s := range tc.steps {
				if s.do != nil {
					s.do(f)
				}
				if s.want != nil {
					f.expectNodes(s.want)
				}
				if s.check != nil {
					s.check(t, f)
				}
				if t.Failed() {
					t.Fatalf("step %d failed", i)
				}
			}
		})
		cleanup(t, f)
	}
}

// cleanup removes a case's cluster-scoped objects so that the next case
// starts with free path indexes; namespaces stay (nothing deletes them in a
// control plane without kube-controller-manager) but no later policy
// selects them.
func cleanup(t *testing.T, f *fixture) {
	f.t = t
	var paths mptcpv1alpha1.MPTCPPathList
	var pols mptcpv1alpha1.MPTCPPolicyList
	var nodes corev1.NodeList
	f.must(f.c.List(f.ctx, &paths), "list paths")
	f.must(f.c.List(f.ctx, &pols), "list policies")
	f.must(f.c.List(f.ctx, &nodes), "list nodes")
	for i := range paths.Items {
		if strings.HasPrefix(paths.Items[i].Name, f.prefix) {
			_ = f.c.Delete(f.ctx, &paths.Items[i])
		}
	}
	for i := range pols.Items {
		if strings.HasPrefix(pols.Items[i].Name, f.prefix) {
			_ = f.c.Delete(f.ctx, &pols.Items[i])
		}
	}
	for i := range nodes.Items {
		if strings.HasPrefix(nodes.Items[i].Name, f.prefix) {
			_ = f.c.Delete(f.ctx, &nodes.Items[i])
		}
	}
}

// histogramCount is how many observations h holds.
func histogramCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// gathered is the value of the series of name with labels that c
// collects, 0 when there is none.
func gathered(t *testing.T, c prometheus.Collector, name string, labels map[string]string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue series
				}
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}
