// Package observe is what the agent shows of the node: Prometheus metrics
// and probes, and the local API's per-connection detail. Both read the
// datapath's maps when asked, never on a timer, and the names of what the
// agent last enforced (a Source); neither changes anything.
package observe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/liveness"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/buildinfo"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// Source is the agent as its observers see it: its datapath, and the names
// of what it last enforced. Every method may be called while a reconcile
// runs.
type Source interface {
	Datapath() *datapath.Datapath
	// PathNames are the paths in force, by index.
	PathNames() map[uint32]string
	// RuleNames are the rules by datapath id, retired ones that live
	// connections still use included.
	RuleNames() map[uint32]string
	// Pods are the selected pods.
	Pods() []podnet.Pod
	// PathManagers are the userspace path managers, up or waiting to
	// restart.
	PathManagers() []podnet.PathManagerState
	// PathDownTransitions count, by path index, the times a path went
	// down after having been up.
	PathDownTransitions() map[uint32]uint64
	// LiveSubflows count, by path index, the subflows whose sockets were
	// open in their pods at the agent's last sweep.
	LiveSubflows() map[uint32]int
	// Liveness lists every peer of every path probed, and the prober's
	// datagram counts (nil and zero when liveness is off).
	Liveness() ([]liveness.PeerState, liveness.Counters)
}

// DefaultMetricsAddr is where the agent serves /metrics, /healthz and
// /readyz unless told otherwise. The agent runs with host networking, so the
// port is taken on every node: 9402 sits in the range Prometheus exporters
// use and is not one the kubelet, kube-proxy, Cilium, Calico or the node
// exporter take.
const DefaultMetricsAddr = ":9402"

const metricsNamespace = "mptcp_agent"

// podLabels are the namespace and pod labels of a pod the agent names
// namespace.name: a namespace has no dot (a DNS label), a pod's name may.
// Prometheus's own target labels of the same names are the agent's pod's;
// the ServiceMonitor keeps these (honorLabels), as kube-state-metrics'.
func podLabels(name string) (namespace, pod string) {
	namespace, pod, _ = strings.Cut(name, ".")
	return namespace, pod
}

// eventNames are the Prometheus label values of the datapath's counters
// (enum stat_id in bpf/include/common.h). A counter missing here is still
// exported, as stat_<n>.
var eventNames = map[datapath.Stat]string{
	datapath.StatPackets:              "packets",
	datapath.StatNotTCP:               "not_tcp",
	datapath.StatMalformed:            "malformed",
	datapath.StatMPTCPSyn:             "mptcp_syn",
	datapath.StatJoinSyn:              "join_syn",
	datapath.StatJoinTokenKnown:       "join_token_known",
	datapath.StatJoinTokenUnknown:     "join_token_unknown",
	datapath.StatTokenLearnt:          "token_learnt",
	datapath.StatSubflowPlaced:        "subflow_placed",
	datapath.StatSubflowMirrored:      "subflow_mirrored",
	datapath.StatMarked:               "marked",
	datapath.StatNoPath:               "no_path",
	datapath.StatPathsExhausted:       "paths_exhausted",
	datapath.StatMPTCPOptInvalid:      "mptcp_option_invalid",
	datapath.StatObserved:             "observed",
	datapath.StatNoRuleMatch:          "no_rule_match",
	datapath.StatPathDownSkipped:      "path_down_skipped",
	datapath.StatAllPathsDown:         "all_paths_down",
	datapath.StatSubflowInsert:        "subflow_insert",
	datapath.StatSubflowEvicted:       "subflow_evicted",
	datapath.StatPoliceEvicted:        "police_bucket_evicted",
	datapath.StatConnInsert:           "connection_insert",
	datapath.StatMapUpdateFailed:      "map_update_failed",
	datapath.StatSubflowForgotten:     "subflow_forgotten",
	datapath.StatConnForgotten:        "connection_forgotten",
	datapath.StatRateDropConn:         "rate_police_drop_connection",
	datapath.StatRateDropPod:          "rate_police_drop_pod",
	datapath.StatRateDropPath:         "rate_police_drop_path",
	datapath.StatRateWndLowered:       "rate_window_lowered",
	datapath.StatRateNoWscale:         "rate_window_scale_unknown",
	datapath.StatRateShaped:           "rate_shape_classified",
	datapath.StatBackupFlagged:        "backup_join_flagged",
	datapath.StatBackupPrioSent:       "backup_prio_sent",
	datapath.StatBackupPrioNoRoom:     "backup_prio_no_room",
	datapath.StatAddAddrBlocked:       "add_addr_blocked",
	datapath.StatJoinRefused:          "join_refused",
	datapath.StatSubflowDetoured:      "subflow_detoured",
	datapath.StatSubflowHomed:         "subflow_homed",
	datapath.StatSubflowFollowed:      "subflow_followed",
	datapath.StatSubflowClosed:        "subflow_closed",
	datapath.StatArrivalStaged:        "arrival_staged",
	datapath.StatArrivalPromoted:      "arrival_promoted",
	datapath.StatAnswerDropped:        "answer_dropped",
	datapath.StatJoinACKDropped:       "join_ack_dropped",
	datapath.StatPodSubflowsFull:      "pod_subflows_full",
	datapath.StatTCPOptsCut:           "tcp_options_cut",
	datapath.StatMPTCPOptsAmbiguous:   "mptcp_options_ambiguous",
	datapath.StatLivenessRefused:      "liveness_refused",
	datapath.StatUnreadableTCPDropped: "unreadable_tcp_dropped",
	datapath.StatEdgeSteered:          "edge_steered",
	datapath.StatTunnelSteered:        "tunnel_steered",
	datapath.StatForeign4TupleDropped: "foreign_4tuple_dropped",
}

// EventName is the label value of a datapath counter in
// mptcp_agent_datapath_events_total.
func EventName(s datapath.Stat) string {
	if n, ok := eventNames[s]; ok {
		return n
	}
	return fmt.Sprintf("stat_%d", uint32(s))
}

var roleNames = map[datapath.Role]string{
	datapath.RoleInitiator: "initiator",
	datapath.RoleResponder: "responder",
}

func roleName(r datapath.Role) string {
	if n, ok := roleNames[r]; ok {
		return n
	}
	return fmt.Sprintf("role_%d", uint32(r))
}

// Metrics are the agent's Prometheus metrics and probes. The datapath's
// counters and tables are read when Prometheus scrapes, never on a timer, so
// a scrape shows the maps as they are and an idle agent does no work; at most
// once per scrapeTTL, whoever scrapes and however many at once (scrapes).
type Metrics struct {
	registry          *prometheus.Registry
	scrapes           *onceAPeriod
	reconcileDuration prometheus.Histogram
	reconcileErrors   prometheus.Counter
	peers             *prometheus.GaugeVec
	ready             atomic.Bool
}

// NewMetrics registers the agent's metrics, the collectors of src's
// datapath and pods, and the Go runtime and process collectors.
func NewMetrics(src Source, log *slog.Logger) *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		reconcileDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricsNamespace,
			Name:      "reconcile_duration_seconds",
			Help:      "Time taken by each reconcile of the node's configuration, failed ones included.",
			// A reconcile takes milliseconds to load nothing and up to
			// seconds when it loads programs and configures many pods.
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}),
		reconcileErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricsNamespace,
			Name:      "reconcile_errors_total",
			Help:      "Reconciles that failed or configurations that were rejected; the last good configuration stayed in force.",
		}),
		peers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricsNamespace,
			Name:      "liveness_peers",
			Help: "Peers that share a path with the node, probed (\"true\") or left out beyond the most a node probes (\"false\"), " +
				"as of the last configuration translated; none while the node has no pods under a policy.",
		}, []string{"probed"}),
	}
	m.scrapes = newOnceAPeriod(m.registry, scrapeTTL)
	m.registry.MustRegister(
		m.reconcileDuration,
		m.reconcileErrors,
		m.peers,
		buildinfo.Collector(metricsNamespace),
		newDatapathCollector(src),
		newRecordCollector(src),
		newPodMPTCPCollector(src, log),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// ObserveReconcile records one reconcile that started at start and ended
// with err. The first successful reconcile makes the agent ready.
func (m *Metrics) ObserveReconcile(start time.Time, err error) {
	m.reconcileDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		m.reconcileErrors.Inc()
		return
	}
	m.ready.Store(true)
}

// ObservePeers records how many peers the plan probes and leaves out.
func (m *Metrics) ObservePeers(probed, unprobed int) {
	m.peers.WithLabelValues("true").Set(float64(probed))
	m.peers.WithLabelValues("false").Set(float64(unprobed))
}

// ObserveRejected records a configuration refused before any reconcile
// (unreadable or invalid file).
func (m *Metrics) ObserveRejected() { m.reconcileErrors.Inc() }

// Gatherer gives the registry, for tests.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.registry }

// Handler serves /metrics, /healthz (the process answers) and /readyz (a
// reconcile has succeeded since the process started: the node is enforced).
// Readiness stays once reached: a later bad configuration leaves the last
// good one in force and is reported in status and in
// mptcp_agent_reconcile_errors_total, not by taking the agent out of a
// rollout's count.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.scrapes, promhttp.HandlerOpts{
		// A map that cannot be read must not hide every other metric.
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      m.registry,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !m.ready.Load() {
			http.Error(w, "no reconcile has succeeded yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// scrapeTTL is how long one collection answers the scrapes that come after
// it. Prometheus scrapes every 15 to 60 s, so a second changes nothing for
// it; for anyone scraping in a loop, it is the most a collection can cost the
// node: one a second, plus its own length.
const scrapeTTL = time.Second

// onceAPeriod is a Gatherer that collects at most once per ttl. A
// collection reads every datapath table (the subflow table whole) and enters
// every selected pod's network namespace, and /metrics is open to whoever
// reaches the port unless -metrics-auth is on: without a bound, scrapes sent
// together would each pay for a collection, and a loop of them would keep
// the agent's CPU busy. Scrapes that arrive while a collection runs wait for
// it and share its result, those that arrive within ttl after it ended get
// that result too, so N scrapes at once cost one collection and the
// collections a second are bounded whatever the scrapers do. Both halves are
// needed: sharing a running collection (a singleflight) alone still lets one
// client that scrapes back to back keep a collection always running.
//
// The result's metric families are shared between the scrapes that get
// them; promhttp only reads them (it copies what it escapes).
type onceAPeriod struct {
	g   prometheus.Gatherer
	ttl time.Duration
	now func() time.Time

	mu    sync.Mutex // held for a collection, so that others wait for it
	ended time.Time  // when the last collection ended; zero before the first
	mfs   []*dto.MetricFamily
	err   error
}

func newOnceAPeriod(g prometheus.Gatherer, ttl time.Duration) *onceAPeriod {
	return &onceAPeriod{g: g, ttl: ttl, now: time.Now}
}

// Gather returns the last collection's result while it is younger than ttl
// (counted from its end, so that a collection slower than ttl is still
// followed by ttl without one), and collects otherwise.
func (c *onceAPeriod) Gather() ([]*dto.MetricFamily, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ended.IsZero() && c.now().Sub(c.ended) < c.ttl {
		return c.mfs, c.err
	}
	c.mfs, c.err = c.g.Gather()
	c.ended = c.now()
	return c.mfs, c.err
}

// Serve listens on addr and serves h until ctx ends. It returns the address
// actually bound (addr may ask for port 0) and a function that waits for the
// server to stop.
func Serve(ctx context.Context, addr string, h http.Handler, log *slog.Logger) (net.Addr, func(), error) {
	return ServeTLS(ctx, addr, h, nil, log)
}

// ServeTLS is Serve over TLS with tlsConfig (plain HTTP when it is nil).
func ServeTLS(ctx context.Context, addr string, h http.Handler, tlsConfig *tls.Config, log *slog.Logger) (net.Addr, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	ln = limitPerSource(ln, connsPerSource)
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	// Every connection ends: a request must arrive whole within the read
	// timeout, its answer leave within the write timeout, and an idle
	// keep-alive connection closes after two minutes (Prometheus scrapes
	// at least once a minute). The server's own complaints (a scanner's
	// failed TLS handshake) go to the agent's log at debug, not to stderr
	// in another format.
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return ln.Addr(), func() { <-done }, nil
}

const observeOnlyHelp = "1 while the datapath is in observe-only mode (it records subflows, connections and counters and writes no mark: nothing is steered), 0 otherwise."

// datapathCollector reads the datapath's maps at scrape time.
type datapathCollector struct {
	src                              Source
	txBytes, txPackets               *prometheus.Desc
	rxBytes, rxPackets               *prometheus.Desc
	events, subflows, connections    *prometheus.Desc
	liveSubflows                     *prometheus.Desc
	endpoints, attachments, pathMgrs *prometheus.Desc
	pathMgrUp, pathMgrRestarts       *prometheus.Desc
	pathMgrJoinsReplaced             *prometheus.Desc
	pathMgrJoinsReleased             *prometheus.Desc
	pathMgrSubflowsLeft              *prometheus.Desc
	observeOnly                      *prometheus.Desc
	pathDown, pathDownTransitions    *prometheus.Desc
	peerUp, peerDowns, peerLoss      *prometheus.Desc
	probesSent, echoesReceived       *prometheus.Desc
	probesAnswered, probesIgnored    *prometheus.Desc
	livenessSocketDrops              *prometheus.Desc
	livenessBusyPeers                *prometheus.Desc
	livenessOverBusyLimit            *prometheus.Desc
}

func newDatapathCollector(src Source) *datapathCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, "", name), help, labels, nil)
	}
	return &datapathCollector{
		src:       src,
		txBytes:   d("path_tx_bytes_total", "Bytes the datapath steered out of the path's NIC (pod_egress), Ethernet header included.", "path"),
		txPackets: d("path_tx_packets_total", "Packets (GSO super-packets count once) the datapath steered out of the path's NIC.", "path"),
		rxBytes:   d("path_rx_bytes_total", "Bytes for selected pods that arrived on the path's NIC (nic_ingress), Ethernet header included.", "path"),
		rxPackets: d("path_rx_packets_total", "Packets for selected pods that arrived on the path's NIC.", "path"),
		events:    d("datapath_events_total", "The datapath's counters (enum stat_id in bpf/include/common.h), summed over CPUs.", "event"),
		liveSubflows: d("live_subflows", "Subflows of the node's selected pods by path whose sockets were open at the agent's last sweep (every 30 s and at each reconcile): "+
			"the subflows that exist, where mptcp_agent_subflows counts table entries.", "path"),
		subflows:    d("subflows", "Entries of the datapath's subflow table by path and by this node's role (initiator: a local pod opened it; responder: a peer did). The table is an LRU: closed subflows stay until evicted.", "path", "role"),
		connections: d("connections", "Entries of the datapath's connection table (an LRU keyed by local pod and token)."),
		endpoints:   d("endpoints", "Pod addresses the datapath selects."),
		attachments: d("attachments", "TCX links the agent has pinned, by hook.", "hook"),
		pathMgrs:    d("path_managers", "Userspace path managers running (listening to their pod's MPTCP events), one per pod whose rule has the agent open joins."),
		// Per pod, as the pod_mptcp_* series: only pods that have a
		// path manager now are exported, so the series are bounded by
		// the node's selected pods and go with them.
		pathMgrUp: d("path_manager_up", "1 while the pod's userspace path manager listens to its MPTCP events, 0 while it waits to restart after its socket failed "+
			"(the pod's new connections get no joins meanwhile).", "namespace", "pod"),
		pathMgrRestarts: d("path_manager_restarts_total", "Times the pod's userspace path manager stopped without being asked to (its event socket failed) and had to start again.", "namespace", "pod"),
		pathMgrJoinsReplaced: d("path_manager_joins_replaced_total", "Joins the pod's userspace path manager opened to replace established subflows the pod's kernel closed "+
			"while their connection lived (at most 8 per connection).", "namespace", "pod"),
		pathMgrJoinsReleased: d("path_manager_joins_released_total", "Joins the pod's userspace path manager opened as backup subflows and made active after the agent's join holdoff "+
			"(a defence against a kernel defect, docs/subflows.md).", "namespace", "pod"),
		pathMgrSubflowsLeft: d("path_manager_subflows_left_total", "Subflows the pod's userspace path manager closed because their path went down while they were recovering from losses: "+
			"their data goes again at once over the connection's other subflows, and a join replaces each when the path is back (docs/subflows.md).", "namespace", "pod"),
		observeOnly: d("observe_only", observeOnlyHelp),
		pathDown: d("path_down", "1 while the path is down on this node (its NIC is missing, has no carrier, or flaps and is held down, or its probes reach none of its peers): "+
			"no new subflow is placed on it and its subflows detour over another path of their rule.", "path"),
		pathDownTransitions: d("path_down_transitions_total", "Times the path went down on this node after having been up, since the agent started.", "path"),
		// Per path and peer node, bounded by the node state's peers
		// (at most 1000) times its paths.
		peerUp: d("path_peer_up", "1 while the peer node echoes the probes sent to it over the path, 0 once it stopped for the detect time; "+
			"absent while it has never echoed. A path whose peers are all 0 is down.", "path", "peer"),
		peerDowns: d("path_peer_down_transitions_total", "Times the peer node went down on the path (stopped echoing the probes sent over it, "+
			"or lost too many of their echoes), since the agent started.", "path", "peer"),
		peerLoss: d("path_peer_probe_loss_ratio", fmt.Sprintf("Share of a window of %d probes sent to the peer node over the path, the last whose echo can no longer come, "+
			"that were not answered; absent until the window is full and while the peer never echoed. An up peer is down for loss once %d of the window's probes "+
			"sent since it was last up went unanswered.", liveness.LossWindow, liveness.LossyAt), "path", "peer"),
		probesSent:     d("liveness_probes_sent_total", "Liveness probes this node sent to its peers, over all paths."),
		echoesReceived: d("liveness_echoes_received_total", "Echoes of this node's liveness probes received from its peers."),
		probesAnswered: d("liveness_probes_answered_total", "The peers' liveness probes this node echoed."),
		probesIgnored: d("liveness_datagrams_ignored_total", "Datagrams to the liveness port that were not a peer's probe or an echo of this node's "+
			"(another sender, a wrong nonce, malformed); what nic_ingress refuses never reaches the agent (mptcp_agent_datapath_events_total{event=\"liveness_refused\"})."),
		livenessSocketDrops: d("liveness_socket_drops_total", "Datagrams the kernel dropped at the liveness port because a path's socket was full, "+
			"before the agent read them, and datagrams with a bad UDP checksum (SO_RXQ_OVFL counts both): echoes among them count as lost."),
		livenessBusyPeers: d("liveness_busy_peers", "Peer nodes probed every interval on a path: the node's pods sent to their pods lately, "+
			"their pod CIDRs are unknown, or they went down on the path lately. The others are probed every idle interval."),
		livenessOverBusyLimit: d("liveness_peers_over_busy_limit", "Peer nodes that would be probed every interval (traffic, unknown pod CIDRs, a path down lately) "+
			"but are probed every idle interval: the node's budget of peers' paths probed every interval (liveness.MaxBusyPaths) went to others."),
	}
}

func (c *datapathCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.txBytes, c.txPackets, c.rxBytes, c.rxPackets, c.events, c.subflows, c.liveSubflows, c.connections, c.endpoints, c.attachments, c.pathMgrs, c.pathMgrUp, c.pathMgrRestarts, c.pathMgrJoinsReplaced, c.pathMgrJoinsReleased, c.pathMgrSubflowsLeft, c.observeOnly, c.pathDown, c.pathDownTransitions,
		c.peerUp, c.peerDowns, c.peerLoss, c.probesSent, c.echoesReceived, c.probesAnswered, c.probesIgnored, c.livenessSocketDrops, c.livenessBusyPeers, c.livenessOverBusyLimit} {
		ch <- d
	}
}

func (c *datapathCollector) Collect(ch chan<- prometheus.Metric) {
	dp := c.src.Datapath()
	names := c.src.PathNames()
	pathLabel := func(index uint32) string {
		if n, ok := names[index]; ok {
			return n
		}
		return fmt.Sprintf("index-%d", index)
	}
	c.collectPaths(ch, dp, names)
	c.collectLiveness(ch, pathLabel)
	c.collectTables(ch, dp, names, pathLabel)
	c.collectPathManagers(ch)
	if on, err := dp.ObserveOnly(); err != nil {
		ch <- prometheus.NewInvalidMetric(c.observeOnly, fmt.Errorf("reading the observe-only switch: %w", err))
	} else {
		ch <- prometheus.MustNewConstMetric(c.observeOnly, prometheus.GaugeValue, boolValue(on))
	}
}

// collectPaths: the configured paths' counters and whether they are down.
func (c *datapathCollector) collectPaths(ch chan<- prometheus.Metric, dp *datapath.Datapath, names map[uint32]string) {
	if ps, err := dp.PathStats(); err != nil {
		ch <- prometheus.NewInvalidMetric(c.txBytes, fmt.Errorf("reading path counters: %w", err))
	} else {
		// Only the configured paths: the others' counters are zero or
		// belong to a path that was removed.
		for index, name := range names {
			if int(index) >= len(ps) {
				continue
			}
			p := ps[index]
			ch <- prometheus.MustNewConstMetric(c.txBytes, prometheus.CounterValue, float64(p.TxBytes), name)
			ch <- prometheus.MustNewConstMetric(c.txPackets, prometheus.CounterValue, float64(p.TxPackets), name)
			ch <- prometheus.MustNewConstMetric(c.rxBytes, prometheus.CounterValue, float64(p.RxBytes), name)
			ch <- prometheus.MustNewConstMetric(c.rxPackets, prometheus.CounterValue, float64(p.RxPackets), name)
		}
	}

	downs := c.src.PathDownTransitions()
	for index, name := range names {
		down, err := dp.PathDown(index)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.pathDown, err)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.pathDown, prometheus.GaugeValue, boolValue(down), name)
		ch <- prometheus.MustNewConstMetric(c.pathDownTransitions, prometheus.CounterValue, float64(downs[index]), name)
	}
}

// collectLiveness: each peer on each path, and the probes' counters.
func (c *datapathCollector) collectLiveness(ch chan<- prometheus.Metric, pathLabel func(uint32) string) {
	peers, counts := c.src.Liveness()
	busy, over := map[string]bool{}, map[string]bool{}
	for _, p := range peers {
		if p.Busy {
			busy[p.Peer.Node] = true
		}
		if p.OverBusyLimit {
			over[p.Peer.Node] = true
		}
		if p.State != liveness.Unknown {
			ch <- prometheus.MustNewConstMetric(c.peerUp, prometheus.GaugeValue, boolValue(p.State == liveness.Up), pathLabel(p.Path), p.Peer.Node)
		}
		ch <- prometheus.MustNewConstMetric(c.peerDowns, prometheus.CounterValue, float64(p.Downs), pathLabel(p.Path), p.Peer.Node)
		if p.Lost >= 0 && p.State != liveness.Unknown {
			ch <- prometheus.MustNewConstMetric(c.peerLoss, prometheus.GaugeValue, float64(p.Lost)/liveness.LossWindow, pathLabel(p.Path), p.Peer.Node)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.probesSent, prometheus.CounterValue, float64(counts.ProbesSent))
	ch <- prometheus.MustNewConstMetric(c.echoesReceived, prometheus.CounterValue, float64(counts.EchoesReceived))
	ch <- prometheus.MustNewConstMetric(c.probesAnswered, prometheus.CounterValue, float64(counts.ProbesAnswered))
	ch <- prometheus.MustNewConstMetric(c.probesIgnored, prometheus.CounterValue, float64(counts.Ignored))
	ch <- prometheus.MustNewConstMetric(c.livenessSocketDrops, prometheus.CounterValue, float64(counts.SocketDrops))
	ch <- prometheus.MustNewConstMetric(c.livenessBusyPeers, prometheus.GaugeValue, float64(len(busy)))
	ch <- prometheus.MustNewConstMetric(c.livenessOverBusyLimit, prometheus.GaugeValue, float64(len(over)))
}

// collectTables: the datapath's counters and what its tables hold.
func (c *datapathCollector) collectTables(ch chan<- prometheus.Metric, dp *datapath.Datapath, names map[uint32]string,
	pathLabel func(uint32) string) {
	if stats, err := dp.Stats(); err != nil {
		ch <- prometheus.NewInvalidMetric(c.events, fmt.Errorf("reading datapath counters: %w", err))
	} else {
		for s, v := range stats {
			ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(v), EventName(s))
		}
	}
	c.collectSubflows(ch, dp, names, pathLabel)
	if conns, err := dp.Connections(); err != nil {
		ch <- prometheus.NewInvalidMetric(c.connections, fmt.Errorf("reading the connection table: %w", err))
	} else {
		ch <- prometheus.MustNewConstMetric(c.connections, prometheus.GaugeValue, float64(len(conns)))
	}
	if eps, err := dp.Endpoints(); err != nil {
		ch <- prometheus.NewInvalidMetric(c.endpoints, fmt.Errorf("reading endpoints: %w", err))
	} else {
		ch <- prometheus.MustNewConstMetric(c.endpoints, prometheus.GaugeValue, float64(len(eps)))
	}
	if atts, err := dp.Attachments(); err != nil {
		ch <- prometheus.NewInvalidMetric(c.attachments, fmt.Errorf("reading attachments: %w", err))
	} else {
		byHook := map[datapath.Hook]int{}
		for _, h := range datapath.Hooks {
			byHook[h] = 0
		}
		for _, att := range atts {
			byHook[att.Hook]++
		}
		for h, n := range byHook {
			ch <- prometheus.MustNewConstMetric(c.attachments, prometheus.GaugeValue, float64(n), string(h))
		}
	}
}

// collectSubflows: the subflow table's entries by path and role, and the
// subflows the last sweep found open.
func (c *datapathCollector) collectSubflows(ch chan<- prometheus.Metric, dp *datapath.Datapath, names map[uint32]string,
	pathLabel func(uint32) string) {
	if sfs, err := dp.Subflows(); err != nil {
		ch <- prometheus.NewInvalidMetric(c.subflows, fmt.Errorf("reading the subflow table: %w", err))
	} else {
		type key struct {
			path string
			role string
		}
		counts := map[key]int{}
		// Every configured path shows both roles, zero included, so a
		// path that carries nothing is visible as such.
		for index := range names {
			for _, r := range []datapath.Role{datapath.RoleInitiator, datapath.RoleResponder} {
				counts[key{pathLabel(index), roleName(r)}] = 0
			}
		}
		for _, sf := range sfs {
			counts[key{pathLabel(sf.Path), roleName(sf.Role)}]++
		}
		for k, n := range counts {
			ch <- prometheus.MustNewConstMetric(c.subflows, prometheus.GaugeValue, float64(n), k.path, k.role)
		}
	}

	live := c.src.LiveSubflows()
	for index := range names {
		ch <- prometheus.MustNewConstMetric(c.liveSubflows, prometheus.GaugeValue, float64(live[index]), pathLabel(index))
	}
}

// collectPathManagers: each pod's userspace path manager, and how many run.
func (c *datapathCollector) collectPathManagers(ch chan<- prometheus.Metric) {
	up := 0
	for _, pm := range c.src.PathManagers() {
		v := 0.0
		if pm.Up {
			v, up = 1, up+1
		}
		ns, pod := podLabels(pm.Pod)
		ch <- prometheus.MustNewConstMetric(c.pathMgrUp, prometheus.GaugeValue, v, ns, pod)
		ch <- prometheus.MustNewConstMetric(c.pathMgrRestarts, prometheus.CounterValue, float64(pm.Restarts), ns, pod)
		ch <- prometheus.MustNewConstMetric(c.pathMgrJoinsReplaced, prometheus.CounterValue, float64(pm.ReplacedJoins), ns, pod)
		ch <- prometheus.MustNewConstMetric(c.pathMgrJoinsReleased, prometheus.CounterValue, float64(pm.ReleasedJoins), ns, pod)
		ch <- prometheus.MustNewConstMetric(c.pathMgrSubflowsLeft, prometheus.CounterValue, float64(pm.LeftSubflows), ns, pod)
	}
	ch <- prometheus.MustNewConstMetric(c.pathMgrs, prometheus.GaugeValue, float64(up))
}

// boolValue is a gauge's value for a yes or no: 1 or 0.
func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
