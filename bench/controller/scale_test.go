package controller

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	controllers "github.com/mptcp-operator/mptcp-operator/internal/controller"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// scaleWrites are the resources counted at scale: the controller's writes
// and the simulated agents' status writes.
var scaleWrites = []string{
	"mptcp.io/mptcpnodestates", "mptcp.io/mptcpnodestates/status", "mptcp.io/mptcppeers",
	"mptcp.io/mptcppolicies/status", "mptcp.io/mptcppaths/status", "events.k8s.io/events",
}

// scalePhase is what one phase of BenchmarkScale measured.
type scalePhase struct {
	name     string
	duration time.Duration
	writes   testenv.Writes
	// apiCPU is the API server's CPU time over the phase, apiRSS its
	// resident memory at the end.
	apiCPU time.Duration
	apiRSS float64
	// p50 and p99 of the time to each node enforced (policy change).
	p50, p99 time.Duration
}

// scaleRun is BenchmarkScale at one cluster size.
type scaleRun struct {
	nodes              int
	phases             []scalePhase
	largestState       int
	largestPeer, peers int
	populate           time.Duration
}

// BenchmarkScale converges clusters of simulated nodes (BENCH_SCALE, a
// comma-separated list; 100 and 1000 by default) of 20 pods each against a
// real API server, with agents simulated in the same process: each writes
// its node state's status as an agent does (its two addresses, the
// generation it enforces) whenever the spec changes. It measures the cold
// start to every node state enforced and every MPTCPPeer written, one node's
// new address, and one policy change every node's pods depend on, with
// BENCH_REPORT=<file> writing the "Scale" section of that file.
func BenchmarkScale(b *testing.B) {
	sizes := []int{100, 1000}
	if v := os.Getenv("BENCH_SCALE"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 2 {
				b.Fatalf("BENCH_SCALE=%q: want node counts from 2", v)
			}
			sizes = append(sizes, n)
		}
	}
	var runs []scaleRun
	for _, n := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			for b.Loop() {
				r := measureScale(b, n)
				runs = append(runs, r)
				for _, p := range r.phases {
					b.Logf("%d nodes, %s: %v, writes %v (%v), API server CPU %v, RSS %.0f MB, p50 %v p99 %v", n, p.name,
						p.duration.Round(time.Millisecond), p.writes.Total(scaleWrites...), p.writes, p.apiCPU.Round(time.Millisecond),
						p.apiRSS/1e6, p.p50, p.p99)
				}
			}
		})
	}
	if path := os.Getenv("BENCH_REPORT"); path != "" && len(runs) > 0 {
		if err := writeScaleReport(path, runs); err != nil {
			b.Fatal(err)
		}
	}
}

func measureScale(tb testing.TB, nodes int) scaleRun {
	env := testenv.Start(tb)
	ctx := context.Background()
	run := scaleRun{nodes: nodes}
	sc := scale{nodes: nodes, podsPerNode: 20, policies: 10, namespaces: 10}
	start := time.Now()
	populate(tb, env.Client, sc)
	run.populate = time.Since(start)
	agents := startFakeAgents(tb, env)

	// Cold: the agents run, the controller starts.
	phase := beginPhase(tb, env, "cold start: every node state enforced and every peer written")
	// The controller with its own client limits, as the chart runs it.
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = controllers.DefaultAPIQPS, controllers.DefaultAPIBurst
	testenv.StartManagerWith(tb, env, cfg)
	waitScale(tb, agents, func(states []mptcpv1alpha1.MPTCPNodeState, peers map[string]mptcpv1alpha1.MPTCPPeer) string {
		if len(states) != nodes {
			return fmt.Sprintf("%d node states of %d", len(states), nodes)
		}
		for i := range states {
			s := &states[i]
			if s.Status.ObservedGeneration != s.Generation || len(s.Spec.Paths) == 0 || len(s.Spec.Paths[0].Addresses) == 0 {
				return s.Name + " not enforced with its addresses given"
			}
		}
		if len(peers) != nodes {
			return fmt.Sprintf("%d peers of %d", len(peers), nodes)
		}
		return ""
	})
	run.phases = append(run.phases, phase.end(tb, env))

	// One node's new address: its node state and its peer, and nothing
	// else.
	victim := fmt.Sprintf("node-%02d", nodes/2)
	phase = beginPhase(tb, env, "one node's new address")
	agents.moveAddress(victim)
	waitScale(tb, agents, func(_ []mptcpv1alpha1.MPTCPNodeState, peers map[string]mptcpv1alpha1.MPTCPPeer) string {
		if p := peers[victim]; len(p.Spec.Paths) == 0 || !slices.Contains(p.Spec.Paths[0].Addresses, agents.address(victim, 0)) {
			return victim + "'s peer without its new address"
		}
		return ""
	})
	moved := phase.end(tb, env)
	if n := moved.writes["mptcp.io/mptcpnodestates"] + moved.writes["mptcp.io/mptcppeers"]; n > 2 {
		tb.Errorf("one node's new address cost %v writes of node states and peers, want its own of each: %v", n, moved.writes)
	}
	run.phases = append(run.phases, moved)

	// A change every node depends on, as TestConvergence makes it.
	phase = beginPhase(tb, env, "one policy change: every node enforced")
	var pol mptcpv1alpha1.MPTCPPolicy
	if err := env.Client.Get(ctx, types.NamespacedName{Name: "policy-0"}, &pol); err != nil {
		tb.Fatal(err)
	}
	pol.Spec.Spread.Paths = append(pol.Spec.Spread.Paths, mptcpv1alpha1.WeightedPath{Name: "fabric-c", Weight: 3})
	changed := time.Now()
	gens := map[string]int64{}
	var states mptcpv1alpha1.MPTCPNodeStateList
	if err := agents.List(ctx, &states); err != nil {
		tb.Fatal(err)
	}
	for _, s := range states.Items {
		gens[s.Name] = s.Generation
	}
	if err := env.Client.Update(ctx, &pol); err != nil {
		tb.Fatal(err)
	}
	waitScale(tb, agents, func(states []mptcpv1alpha1.MPTCPNodeState, _ map[string]mptcpv1alpha1.MPTCPPeer) string {
		for i := range states {
			s := &states[i]
			if s.Generation == gens[s.Name] || s.Status.ObservedGeneration != s.Generation {
				return s.Name + " not enforcing the policy's change"
			}
		}
		return ""
	})
	p := phase.end(tb, env)
	p.writes = p.writes.Sub(testenv.Writes{"mptcp.io/mptcppolicies": 1}) // the benchmark's own update
	var lat []time.Duration
	for name := range gens {
		lat = append(lat, agents.enforcedAt(name).Sub(changed))
	}
	slices.Sort(lat)
	p.p50, p.p99 = lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)*99/100].Round(time.Millisecond)
	run.phases = append(run.phases, p)

	run.largestState, _ = largest(tb, env.Client)
	var peers mptcpv1alpha1.MPTCPPeerList
	if err := env.Client.List(ctx, &peers); err != nil {
		tb.Fatal(err)
	}
	run.peers = len(peers.Items)
	for i := range peers.Items {
		peers.Items[i].ManagedFields = nil
		b, _ := json.Marshal(peers.Items[i])
		run.largestPeer = max(run.largestPeer, len(b))
	}
	return run
}

// openPhase is a phase begun: its start, the API server's writes and CPU.
type openPhase struct {
	name   string
	start  time.Time
	writes testenv.Writes
	cpu    float64
}

func beginPhase(tb testing.TB, env *testenv.Env, name string) openPhase {
	cpu, _ := apiServerProcess(tb, env)
	return openPhase{name: name, start: time.Now(), writes: env.CountWrites(tb), cpu: cpu}
}

// end closes the phase once the controllers are idle: the writes counted
// include those that follow convergence (events, a late rewrite).
func (o openPhase) end(tb testing.TB, env *testenv.Env) scalePhase {
	d := time.Since(o.start)
	testenv.WaitIdle(tb, 2*time.Second, 5*time.Minute)
	cpu, rss := apiServerProcess(tb, env)
	return scalePhase{name: o.name, duration: d, writes: env.CountWrites(tb).Sub(o.writes),
		apiCPU: time.Duration((cpu - o.cpu) * float64(time.Second)), apiRSS: rss}
}

// apiServerProcess reads the API server's process_cpu_seconds_total and
// process_resident_memory_bytes from its /metrics.
func apiServerProcess(tb testing.TB, env *testenv.Env) (cpu, rss float64) {
	cfg := rest.CopyConfig(env.Config)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	resp, err := hc.Get(strings.TrimSuffix(cfg.Host, "/") + "/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "process_cpu_seconds_total":
			cpu = v
		case "process_resident_memory_bytes":
			rss = v
		}
	}
	return cpu, rss
}

// waitScale waits until done, given every node state and every peer by
// name, says nothing is missing. It reads them from the simulated agents'
// cache (watches, as agents read): listing a thousand node states from the
// API server every poll would cost it more than the controller's writes.
func waitScale(tb testing.TB, c client.Reader, done func([]mptcpv1alpha1.MPTCPNodeState, map[string]mptcpv1alpha1.MPTCPPeer) string) {
	tb.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		var states mptcpv1alpha1.MPTCPNodeStateList
		var peers mptcpv1alpha1.MPTCPPeerList
		if err := c.List(ctx, &states, client.UnsafeDisableDeepCopy); err != nil {
			tb.Fatal(err)
		}
		if err := c.List(ctx, &peers, client.UnsafeDisableDeepCopy); err != nil {
			tb.Fatal(err)
		}
		byName := make(map[string]mptcpv1alpha1.MPTCPPeer, len(peers.Items))
		for _, p := range peers.Items {
			byName[p.Name] = p
		}
		if last = done(states.Items, byName); last == "" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("not converged: %s", last)
}

// fakeAgents stand in for every node's agent: whenever a node state's
// generation is not the one its status reports, they write the status an
// agent writes after applying it (the node's addresses on fabric-a and
// fabric-b, the generation) and its Applied event. One controller in the benchmark's process
// serves them all, over one watch: what N agents' own watches of their
// node states cost the API server is not in the figures.
type fakeAgents struct {
	client.Client
	recorder events.EventRecorder
	mu       sync.Mutex
	moved    map[string]bool
	enforced map[string]time.Time
}

func startFakeAgents(tb testing.TB, env *testenv.Env) *fakeAgents {
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:     env.Scheme,
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: boolPtr(true)},
	})
	if err != nil {
		tb.Fatal(err)
	}
	a := &fakeAgents{Client: mgr.GetClient(), recorder: mgr.GetEventRecorder("mptcp-agent"), moved: map[string]bool{}, enforced: map[string]time.Time{}}
	err = ctrl.NewControllerManagedBy(mgr).Named("fake-agents").For(&mptcpv1alpha1.MPTCPNodeState{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 8}).Complete(a)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("fake agents: %v", err)
		}
	})
	return a
}

func boolPtr(b bool) *bool { return &b }

// address is node's address on path k (0: fabric-a, 1: fabric-b), a new
// one on fabric-a once moveAddress moved it.
func (a *fakeAgents) address(node string, k int) string {
	n := 0
	_, _ = fmt.Sscanf(node, "node-%d", &n)
	a.mu.Lock()
	moved := a.moved[node]
	a.mu.Unlock()
	if moved && k == 0 {
		return fmt.Sprintf("10.%d.%d.%d", 210+n/65536, n/256%256, n%256)
	}
	return fmt.Sprintf("10.%d.%d.%d", 200+k*5+n/65536, n/256%256, n%256)
}

// moveAddress gives node a new address on fabric-a, which its agent
// reports at once.
func (a *fakeAgents) moveAddress(node string) {
	a.mu.Lock()
	a.moved[node] = true
	a.mu.Unlock()
	_, _ = a.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: node}})
}

// enforcedAt is when node's agent last reported a new generation.
func (a *fakeAgents) enforcedAt(node string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.enforced[node]
}

func (a *fakeAgents) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var s mptcpv1alpha1.MPTCPNodeState
	if err := a.Get(ctx, req.NamespacedName, &s); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	want := []mptcpv1alpha1.PathState{
		{Name: "fabric-a", Link: mptcpv1alpha1.LinkUp, Interface: "nic1", Addresses: []string{a.address(s.Name, 0)}},
		{Name: "fabric-b", Link: mptcpv1alpha1.LinkUp, Interface: "nic2", Addresses: []string{a.address(s.Name, 1)}},
	}
	if s.Status.ObservedGeneration == s.Generation && equalPaths(s.Status.Paths, want) {
		return reconcile.Result{}, nil
	}
	before := s.DeepCopy()
	newGen := s.Status.ObservedGeneration != s.Generation
	s.Status.Paths, s.Status.ObservedGeneration = want, s.Generation
	s.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Applied", Message: "simulated",
		ObservedGeneration: s.Generation, LastTransitionTime: metav1.Now()}}
	if err := a.Status().Patch(ctx, &s, client.MergeFrom(before)); err != nil {
		return reconcile.Result{}, err
	}
	if newGen {
		a.mu.Lock()
		a.enforced[s.Name] = time.Now()
		a.mu.Unlock()
		a.recorder.Eventf(&s, nil, corev1.EventTypeNormal, "Applied", "Apply", "generation %d enforced (simulated)", s.Generation)
	}
	return reconcile.Result{}, nil
}

func equalPaths(a, b []mptcpv1alpha1.PathState) bool {
	return slices.EqualFunc(a, b, func(x, y mptcpv1alpha1.PathState) bool {
		return x.Name == y.Name && slices.Equal(x.Addresses, y.Addresses)
	})
}

const scaleSection = "## Scale"

// writeScaleReport replaces (or appends) the "Scale" section of the report.
func writeScaleReport(path string, runs []scaleRun) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\n\n", scaleSection)
	fmt.Fprintf(&b, "Measured by `make bench-scale` (bench/controller, `BenchmarkScale`) on %s, %d CPUs, %s, against kube-apiserver %s "+
		"and etcd from envtest assets, the controller in the same process with its own client limits (%d requests a second, "+
		"bursts of %d: the chart's `controller.kubeAPI`). Each cluster has 20 pods per node, 10 policies and 4 paths as in \"Controller convergence\"; every node's "+
		"agent is simulated in the same process and writes its node state's status as an agent does when the spec changes (its "+
		"addresses on two paths, the generation it enforces) and its `Applied` event, over one watch of all node states. Writes are counted by the API "+
		"server, CPU and memory are the API server's own (`process_cpu_seconds_total`, `process_resident_memory_bytes`, etcd "+
		"not included). A phase ends when its condition holds; its writes are counted until the controllers are idle.\n\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), kubeVersion(), controllers.DefaultAPIQPS, controllers.DefaultAPIBurst)
	b.WriteString("| nodes | phase | time | writes | API server CPU | API server RSS | to each node enforced, p50/p99 |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		for _, p := range r.phases {
			lat := "-"
			if p.p99 > 0 {
				lat = fmt.Sprintf("%v/%v", p.p50, p.p99)
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %.0f | %s | %.0f MB | %s |\n", r.nodes, p.name, p.duration.Round(time.Millisecond),
				p.writes.Total(scaleWrites...), p.apiCPU.Round(10*time.Millisecond), p.apiRSS/1e6, lat)
		}
	}
	b.WriteString("\nWrites by resource:\n\n")
	for _, r := range runs {
		for _, p := range r.phases {
			fmt.Fprintf(&b, "- %d nodes, %s: %s\n", r.nodes, p.name, byResource(p.writes, scaleWrites))
		}
	}
	b.WriteString("\n| nodes | pods | populating the API server | largest node state | peers | largest peer |\n|---|---|---|---|---|---|\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "| %d | %d | %s | %d bytes | %d | %d bytes |\n", r.nodes, r.nodes*20, r.populate.Round(time.Second),
			r.largestState, r.peers, r.largestPeer)
	}
	return benchdoc.ReplaceSection(path, scaleSection, b.String())
}
