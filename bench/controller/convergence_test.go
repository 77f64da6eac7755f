// Package controller measures how fast the controller converges a cluster of
// 50 nodes x 20 pods x 10 policies against a real API server, how many writes
// that costs (counted by the API server), and how large node states get.
package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/compile"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// scale is the size of the simulated cluster.
type scale struct {
	nodes, podsPerNode, policies, namespaces int
}

var full = scale{nodes: 50, podsPerNode: 20, policies: 10, namespaces: 10}

// writeResources: what the controller may write (see the controller tests).
var writeResources = []string{
	"mptcp.io/mptcpnodestates", "mptcp.io/mptcppolicies/status", "mptcp.io/mptcppaths/status",
	"/nodes", "events.k8s.io/events",
}

// result of one phase.
type result struct {
	phase        string
	duration     time.Duration
	writes       testenv.Writes
	largestState int
	largestName  string
}

// TestConvergence checks, at the benchmark's scale, that the controller
// converges to exactly what compile.Node makes of the cluster on every node,
// cold and after a policy change; with BENCH_REPORT=<file> it also writes the
// measurements into that file's "Controller convergence" section.
func TestConvergence(t *testing.T) {
	sc := full
	if testing.Short() {
		sc = scale{nodes: 10, podsPerNode: 5, policies: 4, namespaces: 4}
	}
	results := converge(t, sc)
	for _, r := range results {
		t.Logf("%s: %v, %v writes (%v), largest node state %d bytes", r.phase, r.duration.Round(time.Millisecond),
			r.writes.Total(writeResources...), r.writes, r.largestState)
	}
	if path := os.Getenv("BENCH_REPORT"); path != "" && !testing.Short() {
		if err := writeReport(path, sc, results); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkConvergence is TestConvergence at full scale, for `go test -bench`.
func BenchmarkConvergence(b *testing.B) {
	for b.Loop() {
		results := converge(b, full)
		b.ReportMetric(results[0].duration.Seconds(), "cold-s")
		b.ReportMetric(results[0].writes.Total(writeResources...), "cold-writes")
		b.ReportMetric(float64(results[0].largestState), "largest-state-bytes")
		if path := os.Getenv("BENCH_REPORT"); path != "" {
			if err := writeReport(path, full, results); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func converge(tb testing.TB, sc scale) []result {
	env := testenv.Start(tb)
	ctx := context.Background()
	populate(tb, env.Client, sc)

	var results []result

	// Cold: every input exists, the controller starts.
	before := env.CountWrites(tb)
	start := time.Now()
	testenv.StartManager(tb, env)
	waitConverged(tb, env.Client, sc)
	cold := result{phase: "cold start", duration: time.Since(start)}
	testenv.WaitIdle(tb, time.Second, time.Minute)
	cold.writes = env.CountWrites(tb).Sub(before)
	cold.largestState, cold.largestName = largest(tb, env.Client)
	results = append(results, cold)

	// A change every node depends on: the lowest-priority policy gains a
	// path, and every pod it governs gets a new rule.
	before = env.CountWrites(tb)
	start = time.Now()
	var pol mptcpv1alpha1.MPTCPPolicy
	if err := env.Client.Get(ctx, types.NamespacedName{Name: "policy-0"}, &pol); err != nil {
		tb.Fatal(err)
	}
	pol.Spec.Spread.Paths = append(pol.Spec.Spread.Paths, mptcpv1alpha1.WeightedPath{Name: "fabric-c", Weight: 3})
	if err := env.Client.Update(ctx, &pol); err != nil {
		tb.Fatal(err)
	}
	waitConverged(tb, env.Client, sc)
	change := result{phase: "policy change", duration: time.Since(start)}
	testenv.WaitIdle(tb, time.Second, time.Minute)
	change.writes = env.CountWrites(tb).Sub(before)
	change.writes = change.writes.Sub(testenv.Writes{"mptcp.io/mptcppolicies": 1}) // the test's own update
	change.largestState, change.largestName = largest(tb, env.Client)
	results = append(results, change)

	// Nothing changes: a restarted controller must write nothing.
	before = env.CountWrites(tb)
	start = time.Now()
	testenv.StartManager(tb, env) // a second controller, as after a rollout
	testenv.WaitIdle(tb, 2*time.Second, time.Minute)
	idle := result{phase: "second controller started, nothing changed (time until idle)", duration: time.Since(start) - 2*time.Second,
		writes: env.CountWrites(tb).Sub(before)}
	idle.largestState, idle.largestName = change.largestState, change.largestName
	if n := idle.writes.Total(writeResources...); n != 0 {
		tb.Errorf("a controller with nothing to do wrote %v times: %v", n, idle.writes)
	}
	results = append(results, idle)
	return results
}

// populate creates the cluster: nodes (half with fabric-c, a fifth with an
// LTE modem), four paths, namespaces of five tenants, pods bound and running
// (as kubelet would report them), and policies selecting overlapping sets.
func populate(tb testing.TB, c client.Client, sc scale) {
	ctx := context.Background()
	var objs []client.Object
	for i := range sc.nodes {
		labels := map[string]string{"fabric": "ab"}
		if i%2 == 0 {
			labels["fabric-c"] = "yes"
		}
		if i%5 == 0 {
			labels["lte"] = "yes"
		}
		cidr := fmt.Sprintf("10.%d.%d.0/24", 100+i/250, i%250)
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%02d", i), Labels: labels},
			Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}}})
	}
	path := func(name, iface string, sel map[string]string, role mptcpv1alpha1.PathRole) client.Object {
		return &mptcpv1alpha1.MPTCPPath{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: mptcpv1alpha1.MPTCPPathSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: sel},
			Interface:    mptcpv1alpha1.InterfaceSelector{Name: iface},
			Capacity:     resource.MustParse("25G"), DefaultRole: role,
		}}
	}
	objs = append(objs,
		path("fabric-a", "nic1", map[string]string{"fabric": "ab"}, mptcpv1alpha1.PathRoleActive),
		path("fabric-b", "nic2", map[string]string{"fabric": "ab"}, mptcpv1alpha1.PathRoleActive),
		path("fabric-c", "nic3", map[string]string{"fabric-c": "yes"}, mptcpv1alpha1.PathRoleActive),
		path("lte", "wwan0", map[string]string{"lte": "yes"}, mptcpv1alpha1.PathRoleBackup))
	for i := range sc.namespaces {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("tenant-%02d", i),
			Labels: map[string]string{"tenant": fmt.Sprintf("t%d", i%5)}}})
	}
	for k := range sc.policies {
		spec := mptcpv1alpha1.MPTCPPolicySpec{
			Priority:          int32(k * 10),
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": fmt.Sprintf("t%d", k%5)}},
			Spread: mptcpv1alpha1.Spread{Paths: []mptcpv1alpha1.WeightedPath{
				{Name: "fabric-a", Weight: int32(1 + k%3)}, {Name: "fabric-b", Weight: 1}}},
			TenantPreferences: mptcpv1alpha1.Allowed,
			MaxSubflows:       4,
		}
		if k >= sc.policies/2 {
			spec.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", k%3)}}
			spec.Traffic = &mptcpv1alpha1.TrafficMatch{CIDRs: []string{fmt.Sprintf("10.%d.0.0/16", 50+k)},
				Ports: []mptcpv1alpha1.PortRange{{Port: 443}, {Port: 8000, EndPort: 8100}}}
			spec.HeaderRewriting = mptcpv1alpha1.Allowed
			spec.BackupPaths = []string{"lte"}
			q := resource.MustParse("1G")
			spec.RateLimits = &mptcpv1alpha1.RateLimits{Mode: mptcpv1alpha1.RateModePolice, PerPod: &q}
		}
		objs = append(objs, &mptcpv1alpha1.MPTCPPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("policy-%d", k)}, Spec: spec})
	}
	createAll(tb, c, objs)

	var pods []client.Object
	for n := range sc.nodes {
		for j := range sc.podsPerNode {
			i := n*sc.podsPerNode + j
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{
					Namespace: fmt.Sprintf("tenant-%02d", i%sc.namespaces), Name: fmt.Sprintf("pod-%04d", i),
					Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%3)},
				},
				Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%02d", n),
					Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app"}}},
			}
			if i%7 == 0 {
				p.Annotations = map[string]string{mptcpv1alpha1.AnnotationPreferredPaths: "fabric-b"}
			}
			pods = append(pods, p)
		}
	}
	createAll(tb, c, pods)
	parallel(tb, pods, func(o client.Object) error {
		p := o.(*corev1.Pod)
		n := 0
		_, _ = fmt.Sscanf(p.Spec.NodeName, "node-%d", &n)
		var i int
		_, _ = fmt.Sscanf(p.Name, "pod-%d", &i)
		ip := fmt.Sprintf("10.%d.%d.%d", 100+n/250, n%250, 10+i%sc.podsPerNode)
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
		return c.Status().Update(ctx, p)
	})
}

func createAll(tb testing.TB, c client.Client, objs []client.Object) {
	parallel(tb, objs, func(o client.Object) error { return c.Create(context.Background(), o) })
}

// parallel runs fn over objs with a few workers, as several kubelets would.
func parallel(tb testing.TB, objs []client.Object, fn func(client.Object) error) {
	tb.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(objs))
	work := make(chan client.Object)
	for range 8 {
		wg.Go(func() {
			for o := range work {
				if err := fn(o); err != nil {
					errs <- fmt.Errorf("%s: %w", o.GetName(), err)
				}
			}
		})
	}
	for _, o := range objs {
		work <- o
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
}

// waitConverged waits until every node's state is byte-identical to what
// compile.Node makes of the cluster as the API server holds it now.
func waitConverged(tb testing.TB, c client.Client, sc scale) {
	tb.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(3 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		var states mptcpv1alpha1.MPTCPNodeStateList
		if err := c.List(ctx, &states); err != nil {
			tb.Fatal(err)
		}
		if len(states.Items) == sc.nodes {
			if last = diff(tb, c, states.Items); last == "" {
				return
			}
		} else {
			last = fmt.Sprintf("%d node states of %d", len(states.Items), sc.nodes)
		}
		time.Sleep(100 * time.Millisecond)
	}
	tb.Fatalf("not converged: %s", last)
}

func diff(tb testing.TB, c client.Client, states []mptcpv1alpha1.MPTCPNodeState) string {
	ctx := context.Background()
	var nodes corev1.NodeList
	var paths mptcpv1alpha1.MPTCPPathList
	var pols mptcpv1alpha1.MPTCPPolicyList
	var nss corev1.NamespaceList
	var pods corev1.PodList
	for _, l := range []client.ObjectList{&nodes, &paths, &pols, &nss, &pods} {
		if err := c.List(ctx, l); err != nil {
			tb.Fatal(err)
		}
	}
	nsLabels := map[string]map[string]string{}
	for _, ns := range nss.Items {
		nsLabels[ns.Name] = ns.Labels
	}
	byNode := map[string][]corev1.Pod{}
	for _, p := range pods.Items {
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
	}
	stateOf := map[string]*mptcpv1alpha1.MPTCPNodeState{}
	for i := range states {
		stateOf[states[i].Name] = &states[i]
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		want, _ := json.Marshal(compile.Node(compile.Input{Node: n, Paths: paths.Items, Policies: pols.Items,
			NamespaceLabels: nsLabels, Pods: byNode[n.Name]}).Spec)
		s := stateOf[n.Name]
		if s == nil {
			return "no node state for " + n.Name
		}
		got, _ := json.Marshal(s.Spec)
		if string(got) != string(want) {
			return n.Name + " differs"
		}
	}
	return ""
}

func largest(tb testing.TB, c client.Client) (int, string) {
	var states mptcpv1alpha1.MPTCPNodeStateList
	if err := c.List(context.Background(), &states); err != nil {
		tb.Fatal(err)
	}
	size, name := 0, ""
	for i := range states.Items {
		s := &states.Items[i]
		s.ManagedFields = nil
		b, _ := json.Marshal(s)
		if len(b) > size {
			size, name = len(b), s.Name
		}
	}
	return size, name
}

const section = "## Controller convergence"

// writeReport replaces (or appends) the "Controller convergence" section of
// the report, leaving the rest of the file to its other authors.
func writeReport(path string, sc scale, results []result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", section)
	fmt.Fprintf(&b, "Measured by `make bench-controller` (bench/controller) on %s, %d CPUs, %s, against kube-apiserver %s and etcd "+
		"from envtest assets, controller in the same process. Cluster: %d nodes x %d pods per node (%d pods), %d policies "+
		"(half with pod selectors, traffic matches, backup paths and rate limits), 4 paths, %d namespaces; every seventh pod "+
		"carries a tenant preference. Writes are counted by the API server (`apiserver_request_total`, write verbs) on node "+
		"states, policy and path status, Nodes and events; converged means every node state is byte-identical to what "+
		"`compile.Node` makes of the cluster.\n\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), kubeVersion(), sc.nodes, sc.podsPerNode,
		sc.nodes*sc.podsPerNode, sc.policies, sc.namespaces)
	b.WriteString("| phase | time to converge | writes | largest node state |\n|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s | %.0f | %d bytes (%s) |\n", r.phase, r.duration.Round(time.Millisecond),
			r.writes.Total(writeResources...), r.largestState, r.largestName)
	}
	b.WriteString("\nWrites by resource:\n\n")
	for _, r := range results {
		fmt.Fprintf(&b, "- %s: %s\n", r.phase, byResource(r.writes, writeResources))
	}
	b.WriteString("\nA node state holds only its own node's paths and pods, so its size depends on pods per node and rules " +
		"per pod, not on the number of nodes; the other nodes' addresses are the MPTCPPeers (\"Scale\" below). The benchmark's " +
		"agents report no addresses, so it writes no peer.\n")

	return benchdoc.ReplaceSection(path, section, b.String())
}

// shortResource names a resource of writeResources or scaleWrites for a
// report: its resource (and subresource) without group or "mptcp".
func shortResource(r string) string {
	_, name, ok := strings.Cut(r, "/")
	if !ok {
		return r
	}
	return strings.TrimPrefix(name, "mptcp")
}

// byResource lists w's counts of resources, in their order, the zeroes
// left out.
func byResource(w testenv.Writes, resources []string) string {
	var parts []string
	for _, r := range resources {
		if v := w[r]; v != 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", shortResource(r), v))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func kubeVersion() string {
	if v := os.Getenv("KUBE_VERSION"); v != "" {
		return v
	}
	return "(KUBE_VERSION unset)"
}
