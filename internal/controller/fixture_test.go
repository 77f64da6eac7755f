package controller_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// fixture builds one test case's cluster objects. Every cluster-scoped name
// and every namespace gets the case's prefix, and the case's policies and
// paths select only the case's namespaces and nodes, so cases share one API
// server without seeing each other.
type fixture struct {
	t      *testing.T
	c      client.Client
	prefix string
	ctx    context.Context
}

func newFixture(t *testing.T, env *testenv.Env, id int) *fixture {
	return &fixture{t: t, c: env.Client, prefix: fmt.Sprintf("c%d-", id), ctx: context.Background()}
}

// n returns the real (prefixed) name of a short name.
func (f *fixture) n(short string) string { return f.prefix + short }

// short strips the case prefix.
func (f *fixture) short(name string) string { return strings.TrimPrefix(name, f.prefix) }

func (f *fixture) caseLabels(extra map[string]string) map[string]string {
	l := map[string]string{"case": strings.TrimSuffix(f.prefix, "-")}
	for k, v := range extra {
		l[k] = v
	}
	return l
}

func (f *fixture) must(err error, what string) {
	f.t.Helper()
	if err != nil {
		f.t.Fatalf("%s: %v", what, err)
	}
}

// changePolicy changes the spec of the case's policy short as change says,
// reading it again when the controller wrote its status in between (a
// conflict on the update).
func (f *fixture) changePolicy(short string, change func(*mptcpv1alpha1.MPTCPPolicySpec)) {
	f.t.Helper()
	f.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var p mptcpv1alpha1.MPTCPPolicy
		if err := f.c.Get(f.ctx, types.NamespacedName{Name: f.n(short)}, &p); err != nil {
			return err
		}
		change(&p.Spec)
		return f.c.Update(f.ctx, &p)
	}), "change policy "+short)
}

// node creates a node with the case label, extra labels and a pod CIDR.
func (f *fixture) node(short string, labels map[string]string, podCIDR string) {
	f.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.n(short), Labels: f.caseLabels(labels)}}
	if podCIDR != "" {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR, []string{podCIDR}
	}
	f.must(f.c.Create(f.ctx, n), "create node "+short)
}

func (f *fixture) deleteNode(short string) {
	f.t.Helper()
	f.must(f.c.Delete(f.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.n(short)}}), "delete node")
}

// path creates a path on the case's nodes that carry nodeLabels.
func (f *fixture) path(short, iface string, nodeLabels map[string]string, role mptcpv1alpha1.PathRole) {
	f.t.Helper()
	p := &mptcpv1alpha1.MPTCPPath{
		ObjectMeta: metav1.ObjectMeta{Name: f.n(short)},
		Spec: mptcpv1alpha1.MPTCPPathSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: f.caseLabels(nodeLabels)},
			Interface:    mptcpv1alpha1.InterfaceSelector{Name: iface},
			Capacity:     resource.MustParse("10G"),
			DefaultRole:  role,
		},
	}
	f.must(f.c.Create(f.ctx, p), "create path "+short)
}

// policy creates a policy selecting the case's namespaces carrying nsLabels
// and, when podLabels is not nil, the pods carrying them. spread lists short
// path names, each optionally "name=weight".
func (f *fixture) policy(short string, priority int32, nsLabels, podLabels map[string]string, spread []string, edit func(*mptcpv1alpha1.MPTCPPolicySpec)) {
	f.t.Helper()
	spec := mptcpv1alpha1.MPTCPPolicySpec{
		Priority:          priority,
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: f.caseLabels(nsLabels)},
	}
	if podLabels != nil {
		spec.PodSelector = &metav1.LabelSelector{MatchLabels: podLabels}
	}
	for _, s := range spread {
		name, w, _ := strings.Cut(s, "=")
		var weight int32
		if w != "" {
			_, _ = fmt.Sscan(w, &weight)
		}
		spec.Spread.Paths = append(spec.Spread.Paths, mptcpv1alpha1.WeightedPath{Name: f.n(name), Weight: weight})
	}
	if edit != nil {
		edit(&spec)
	}
	p := &mptcpv1alpha1.MPTCPPolicy{ObjectMeta: metav1.ObjectMeta{Name: f.n(short)}, Spec: spec}
	f.must(f.c.Create(f.ctx, p), "create policy "+short)
}

func (f *fixture) namespace(short string, labels map[string]string) {
	f.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.n(short), Labels: f.caseLabels(labels)}}
	f.must(f.c.Create(f.ctx, ns), "create namespace "+short)
}

func (f *fixture) labelNamespace(short string, labels map[string]string) {
	f.t.Helper()
	var ns corev1.Namespace
	f.must(f.c.Get(f.ctx, types.NamespacedName{Name: f.n(short)}, &ns), "get namespace")
	ns.Labels = f.caseLabels(labels)
	f.must(f.c.Update(f.ctx, &ns), "label namespace")
}

// pod plays kubelet: it creates a pod bound to a node and marks it Running
// with an address.
func (f *fixture) pod(ns, name, node, ip string, labels, annotations map[string]string) {
	f.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.n(ns), Name: name, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{
			NodeName:   f.n(node),
			Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app"}},
		},
	}
	f.must(f.c.Create(f.ctx, p), "create pod "+name)
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	f.must(f.c.Status().Update(f.ctx, p), "set pod status "+name)
}

func (f *fixture) deletePod(ns, name string) {
	f.t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: f.n(ns), Name: name}}
	// Without a kubelet, a graceful delete never finishes.
	f.must(f.c.Delete(f.ctx, p, client.GracePeriodSeconds(0)), "delete pod "+name)
	testutil.Eventually(f.t, 15*time.Second, 50*time.Millisecond, "pod "+name+" gone", func() error {
		err := f.c.Get(f.ctx, client.ObjectKeyFromObject(p), p)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%w)", err)
	})
}

func (f *fixture) annotatePod(ns, name string, annotations map[string]string) {
	f.t.Helper()
	var p corev1.Pod
	f.must(f.c.Get(f.ctx, types.NamespacedName{Namespace: f.n(ns), Name: name}, &p), "get pod")
	p.Annotations = annotations
	f.must(f.c.Update(f.ctx, &p), "annotate pod")
}

// labelPod replaces a pod's labels, as its tenant may.
func (f *fixture) labelPod(ns, name string, labels map[string]string) {
	f.t.Helper()
	var p corev1.Pod
	f.must(f.c.Get(f.ctx, types.NamespacedName{Namespace: f.n(ns), Name: name}, &p), "get pod")
	p.Labels = labels
	f.must(f.c.Update(f.ctx, &p), "label pod")
}

// report plays the node's agent: it writes the paths it found into the node
// state's status.
func (f *fixture) report(node string, paths ...mptcpv1alpha1.PathState) {
	f.t.Helper()
	f.agentStatus(node, func(st *mptcpv1alpha1.MPTCPNodeStateStatus) {
		st.Paths = nil
		for _, p := range paths {
			p.Name = f.n(p.Name)
			st.Paths = append(st.Paths, p)
		}
	})
}

// applyAll plays the node's agent: it reports every policy in its spec as
// applied at the compiled generation.
func (f *fixture) applyAll(node string) {
	f.t.Helper()
	f.agentStatus(node, func(st *mptcpv1alpha1.MPTCPNodeStateStatus) {})
}

// agentStatus writes a node state's status as its agent would; the applied
// policies are always those of the current spec.
func (f *fixture) agentStatus(node string, edit func(*mptcpv1alpha1.MPTCPNodeStateStatus)) {
	f.t.Helper()
	testutil.Eventually(f.t, 15*time.Second, 50*time.Millisecond, "agent status on "+node, func() error {
		var s mptcpv1alpha1.MPTCPNodeState
		if err := f.c.Get(f.ctx, types.NamespacedName{Name: f.n(node)}, &s); err != nil {
			return err
		}
		edit(&s.Status)
		applied := map[string]int64{}
		for _, r := range s.Spec.Rules {
			applied[r.Policy] = r.PolicyGeneration
		}
		s.Status.AppliedPolicies = nil
		for name, gen := range applied {
			s.Status.AppliedPolicies = append(s.Status.AppliedPolicies, mptcpv1alpha1.AppliedPolicy{Name: name, Generation: gen})
		}
		slices.SortFunc(s.Status.AppliedPolicies, func(a, b mptcpv1alpha1.AppliedPolicy) int { return strings.Compare(a.Name, b.Name) })
		s.Status.ObservedGeneration = s.Generation
		return f.c.Status().Update(f.ctx, &s)
	})
}

// expectPeers waits until the case's MPTCPPeers are exactly want: the
// paths of each, by the node's short name.
func (f *fixture) expectPeers(want map[string][]mptcpv1alpha1.PeerPath) {
	f.t.Helper()
	testutil.Eventually(f.t, 15*time.Second, 50*time.Millisecond, "peers", func() error {
		got, err := f.peers()
		if err != nil {
			return err
		}
		paths := map[string][]mptcpv1alpha1.PeerPath{}
		for node, p := range got {
			paths[node] = p.Spec.Paths
		}
		if !equality.Semantic.DeepEqual(paths, want) {
			return fmt.Errorf("peers %+v, want %+v", paths, want)
		}
		return nil
	})
}

// peers are the case's MPTCPPeers by the node's short name. The cases
// share one API server and give their nodes the same pod CIDRs, which the
// controller drops as overlapping while cases run side by side: which
// CIDRs a peer gets is compile's to test
// (TestPeersGetOnlyPodCIDRsNoOtherNodeClaims).
func (f *fixture) peers() (map[string]mptcpv1alpha1.MPTCPPeer, error) {
	var l mptcpv1alpha1.MPTCPPeerList
	if err := f.c.List(f.ctx, &l); err != nil {
		return nil, err
	}
	out := map[string]mptcpv1alpha1.MPTCPPeer{}
	for _, p := range l.Items {
		if strings.HasPrefix(p.Name, f.prefix) {
			out[f.short(p.Name)] = p
		}
	}
	return out, nil
}

// summary renders a node state spec as one line per pod:
// "ns/pod 10.0.0.1: policy[path/weight,...|backup:...|blocked:...|max:N|mode perPod=...]+pref; ..."
// with case prefixes stripped.
func (f *fixture) summary(spec mptcpv1alpha1.MPTCPNodeStateSpec) []string {
	var out []string
	for _, p := range spec.Pods {
		var rules []string
		for _, name := range p.Rules {
			r := spec.Rule(name)
			if r == nil {
				rules = append(rules, "missing rule "+name)
				continue
			}
			var paths []string
			for _, rp := range r.Paths {
				paths = append(paths, fmt.Sprintf("%s/%d", f.short(rp.Name), rp.Weight))
			}
			s := f.short(r.Policy) + "[" + strings.Join(paths, ",")
			if len(r.BackupPaths) > 0 {
				s += "|backup:" + strings.Join(f.shorts(r.BackupPaths), ",")
			}
			if len(r.BlockedPaths) > 0 {
				s += "|blocked:" + strings.Join(f.shorts(r.BlockedPaths), ",")
			}
			if r.MaxSubflows != 4 { // the default, left out
				s += fmt.Sprintf("|max:%d", r.MaxSubflows)
			}
			if rl := r.RateLimits; rl != nil {
				s += "|" + string(rl.Mode)
				if rl.PerConnection != nil {
					s += " perConnection=" + rl.PerConnection.String()
				}
				if rl.PerPod != nil {
					s += " perPod=" + rl.PerPod.String()
				}
			}
			s += "]"
			if len(r.PreferredPaths) > 0 {
				s += "+pref"
			}
			rules = append(rules, s)
		}
		out = append(out, fmt.Sprintf("%s/%s %s: %s", f.short(p.Namespace), p.Name, strings.Join(p.IPs, ","), strings.Join(rules, "; ")))
	}
	return out
}

func (f *fixture) shorts(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = f.short(n)
	}
	return out
}

// expectNodes waits until the node states of the case match want (node ->
// pod summaries); a node mapped to nil must have no node state at all.
func (f *fixture) expectNodes(want map[string][]string) {
	f.t.Helper()
	testutil.Eventually(f.t, 15*time.Second, 50*time.Millisecond, "node states", func() error {
		var problems []string
		for node, pods := range want {
			var s mptcpv1alpha1.MPTCPNodeState
			err := f.c.Get(f.ctx, types.NamespacedName{Name: f.n(node)}, &s)
			if pods == nil {
				if !apierrors.IsNotFound(err) {
					problems = append(problems, fmt.Sprintf("%s: node state still exists (%v)", node, err))
				}
				continue
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", node, err))
				continue
			}
			got := f.summary(s.Spec)
			if !slices.Equal(got, pods) {
				problems = append(problems, fmt.Sprintf("%s:\n  got  %q\n  want %q", node, got, pods))
			}
		}
		if len(problems) > 0 {
			return fmt.Errorf("%s", strings.Join(problems, "\n"))
		}
		return nil
	})
}

// expectEvent waits for a Warning event with reason on a pod.
func (f *fixture) expectEvent(ns, pod, reason string) {
	f.t.Helper()
	testutil.Eventually(f.t, 15*time.Second, 50*time.Millisecond, "event "+reason+" on "+pod, func() error {
		var evs eventsv1.EventList
		if err := f.c.List(f.ctx, &evs, client.InNamespace(f.n(ns))); err != nil {
			return err
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Regarding.Kind == "Pod" && e.Regarding.Name == pod && e.Reason == reason && e.Type == corev1.EventTypeWarning {
				return nil
			}
			seen = append(seen, e.Regarding.Name+":"+e.Reason)
		}
		return fmt.Errorf("not found among %v", seen)
	})
}

// expectObjectEvent waits for a Warning event with reason on a
// cluster-scoped object of kind.
func (f *fixture) expectObjectEvent(kind, name, reason string) {
	f.t.Helper()
	f.expectObjectEventOfType(kind, name, reason, corev1.EventTypeWarning)
}

// expectObjectEventOfType waits for an event of type with reason on a
// cluster-scoped object of kind.
func (f *fixture) expectObjectEventOfType(kind, name, reason, eventType string) {
	f.t.Helper()
	testutil.Eventually(f.t, 15*time.Second, 50*time.Millisecond, "event "+reason+" on "+kind+" "+name, func() error {
		var evs eventsv1.EventList
		if err := f.c.List(f.ctx, &evs); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Reason == reason && e.Type == eventType {
				return nil
			}
		}
		return fmt.Errorf("not found among %d events", len(evs.Items))
	})
}

// expectNoEvent checks that no Warning event was recorded for a pod.
func (f *fixture) expectNoEvent(ns, pod string) {
	f.t.Helper()
	var evs eventsv1.EventList
	f.must(f.c.List(f.ctx, &evs, client.InNamespace(f.n(ns))), "list events")
	for _, e := range evs.Items {
		if e.Regarding.Name == pod && e.Type == corev1.EventTypeWarning {
			f.t.Fatalf("unexpected Warning event on %s: %s %s", pod, e.Reason, e.Note)
		}
	}
}

// condition waits until an object's condition has the wanted status and a
// message containing text.
func (f *fixture) condition(obj client.Object, conds func() []metav1.Condition, typ string, status metav1.ConditionStatus, text string) {
	f.t.Helper()
	testutil.Eventually(f.t, 15*time.Second, 50*time.Millisecond, fmt.Sprintf("%s %s=%s", obj.GetName(), typ, status), func() error {
		if err := f.c.Get(f.ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		for _, c := range conds() {
			if c.Type != typ {
				continue
			}
			if c.Status != status || !strings.Contains(c.Message, text) {
				return fmt.Errorf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
			}
			return nil
		}
		return fmt.Errorf("no condition %s in %v", typ, conds())
	})
}
