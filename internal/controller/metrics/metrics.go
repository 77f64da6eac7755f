// Package metrics is the controller's own Prometheus metrics, beside those
// controller-runtime exports (reconciles, errors, work queues): how long
// compiling a node takes, and the state of the operator's objects as the
// controller's cache holds them (docs/controller.md, "Metrics").
package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

const namespace = "mptcp_controller"

// CompileDuration is the time compile.Node takes for one node: the CPU the
// controller spends per node and change, without the API's round trips
// (controller_runtime_reconcile_time_seconds has those).
var CompileDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
	Namespace: namespace,
	Name:      "compile_duration_seconds",
	Help:      "Time to compile one node's MPTCPNodeState spec from the cluster's paths, policies and pods.",
	Buckets:   prometheus.ExponentialBuckets(50e-6, 4, 9), // 50 µs to about 3 s
})

// Objects reports, at each scrape, how many MPTCPPolicies and
// MPTCPNodeStates have each status of their Ready and Degraded conditions,
// and each node whose state is Degraded, from reader (the manager's cache:
// a scrape sends nothing to the API server). A replica reports only once
// elected is closed, so that an alert on these counts sees the leader's
// alone.
//
// A collection walks every policy and node state, so it is shared: scrapes
// that arrive while one runs wait for it and get its result, and with
// ReuseFor, so do those that arrive within a while after it ended. Scrapes
// sent together then cost one walk, and scrapes in a loop at most one walk
// per period plus its length, whoever sends them.
type Objects struct {
	reader  client.Reader
	elected <-chan struct{}
	ttl     time.Duration
	now     func() time.Time

	policies, nodeStates, degraded *prometheus.Desc

	mu    sync.Mutex // held for a collection, so that others wait for it
	ended time.Time  // when the last collection ended; zero before the first
	last  []prometheus.Metric
	walks int // collections made, for tests
}

// ScrapeTTL is how long the controller reuses a collection: Prometheus
// scrapes every 15 to 60 s, so a second changes nothing for it.
const ScrapeTTL = time.Second

// NewObjects is the collector of reader's objects, reported once elected
// is closed. It shares a collection only between the scrapes that wait
// for it; ReuseFor lets later ones reuse it too.
func NewObjects(reader client.Reader, elected <-chan struct{}) *Objects {
	return &Objects{
		reader: reader, elected: elected, now: time.Now,
		policies: prometheus.NewDesc(prometheus.BuildFQName(namespace, "", "policies"),
			"MPTCPPolicies by the status of their condition (Ready, Degraded).", []string{"condition", "status"}, nil),
		nodeStates: prometheus.NewDesc(prometheus.BuildFQName(namespace, "", "node_states"),
			"MPTCPNodeStates by the status of their condition (Ready, Degraded), as their agents report it.", []string{"condition", "status"}, nil),
		degraded: prometheus.NewDesc(prometheus.BuildFQName(namespace, "", "node_state_degraded"),
			"1 for each node whose MPTCPNodeState is Degraded, with the condition's reason; no series for the others.", []string{"node", "reason"}, nil),
	}
}

// ReuseFor makes a collection answer the scrapes that arrive up to ttl
// after it ended, and returns o.
func (o *Objects) ReuseFor(ttl time.Duration) *Objects {
	o.ttl = ttl
	return o
}

// Walks is how many collections o has made.
func (o *Objects) Walks() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.walks
}

func (o *Objects) Describe(ch chan<- *prometheus.Desc) {
	ch <- o.policies
	ch <- o.nodeStates
	ch <- o.degraded
}

// conditions counted, and the statuses each is counted by (every one, so
// that a count of zero is a series with value 0, not an absent one).
var (
	counted  = []string{mptcpv1alpha1.ConditionReady, mptcpv1alpha1.ConditionDegraded}
	statuses = []metav1.ConditionStatus{metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionUnknown}
)

func (o *Objects) Collect(ch chan<- prometheus.Metric) {
	select {
	case <-o.elected:
	default:
		return
	}
	arrived := o.now()
	o.mu.Lock()
	// A collection that ended after this scrape arrived ran while it
	// waited: its result is as fresh as one of its own.
	if !o.ended.IsZero() && (!o.ended.Before(arrived) || arrived.Sub(o.ended) < o.ttl) {
		ms := o.last
		o.mu.Unlock()
		for _, m := range ms {
			ch <- m
		}
		return
	}
	ms := o.collect()
	o.last, o.ended = ms, o.now()
	o.walks++
	o.mu.Unlock()
	// Const metrics are immutable: every scrape may send the same ones.
	for _, m := range ms {
		ch <- m
	}
}

// collect walks the cache's policies and node states. It reads them in
// place (no deep copy: the cache's objects are only read here), so a walk
// costs no copy of the cluster's objects.
func (o *Objects) collect() []prometheus.Metric {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []prometheus.Metric
	var policies mptcpv1alpha1.MPTCPPolicyList
	if err := o.reader.List(ctx, &policies, client.UnsafeDisableDeepCopy); err == nil {
		conds := make([][]metav1.Condition, 0, len(policies.Items))
		for _, p := range policies.Items {
			conds = append(conds, p.Status.Conditions)
		}
		out = o.count(out, o.policies, conds)
	}
	var states mptcpv1alpha1.MPTCPNodeStateList
	if err := o.reader.List(ctx, &states, client.UnsafeDisableDeepCopy); err == nil {
		conds := make([][]metav1.Condition, 0, len(states.Items))
		for _, s := range states.Items {
			conds = append(conds, s.Status.Conditions)
			if d := meta.FindStatusCondition(s.Status.Conditions, mptcpv1alpha1.ConditionDegraded); d != nil && d.Status == metav1.ConditionTrue {
				out = append(out, prometheus.MustNewConstMetric(o.degraded, prometheus.GaugeValue, 1, s.Name, degradedReason(d.Reason)))
			}
		}
		out = o.count(out, o.nodeStates, conds)
	}
	return out
}

// degradedReasons are the reasons an agent gives Degraded=True
// (internal/agent/kube). A node's agent writes its node state, so a
// compromised node could write any reason: a label takes only these, and
// Other for the rest, so that it cannot grow the series without bound.
var degradedReasons = map[string]bool{
	mptcpv1alpha1.ReasonInterfaceMissing: true,
	mptcpv1alpha1.ReasonInvalidSpec:      true,
	mptcpv1alpha1.ReasonApplyFailed:      true,
	mptcpv1alpha1.ReasonMarkClash:        true,
	mptcpv1alpha1.ReasonCapsNotEnforced:  true,
}

func degradedReason(r string) string {
	if degradedReasons[r] {
		return r
	}
	return "Other"
}

// count appends, for each counted condition and status, how many of the
// objects' condition lists have it; a missing condition counts as Unknown.
func (o *Objects) count(out []prometheus.Metric, desc *prometheus.Desc, objects [][]metav1.Condition) []prometheus.Metric {
	for _, t := range counted {
		n := map[metav1.ConditionStatus]int{}
		for _, conds := range objects {
			status := metav1.ConditionUnknown
			if c := meta.FindStatusCondition(conds, t); c != nil {
				status = c.Status
			}
			n[status]++
		}
		for _, s := range statuses {
			out = append(out, prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(n[s]), t, string(s)))
		}
	}
	return out
}
