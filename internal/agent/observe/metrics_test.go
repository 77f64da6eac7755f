package observe

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/liveness"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
	privileged "github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// source is an agent as its observers see it.
type source struct {
	dp           *datapath.Datapath
	paths, rules map[uint32]string
	pods         []podnet.Pod
	pms          []podnet.PathManagerState
	downs        map[uint32]uint64
	live         map[uint32]int
	peers        []liveness.PeerState
	probes       liveness.Counters
}

func (s *source) Datapath() *datapath.Datapath            { return s.dp }
func (s *source) PathNames() map[uint32]string            { return s.paths }
func (s *source) RuleNames() map[uint32]string            { return s.rules }
func (s *source) Pods() []podnet.Pod                      { return s.pods }
func (s *source) PathManagers() []podnet.PathManagerState { return s.pms }
func (s *source) PathDownTransitions() map[uint32]uint64  { return s.downs }
func (s *source) LiveSubflows() map[uint32]int            { return s.live }
func (s *source) Liveness() ([]liveness.PeerState, liveness.Counters) {
	return s.peers, s.probes
}

func probe(t *testing.T, srv *httptest.Server, path string) int {
	t.Helper()
	resp, err := http.Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// The agent is healthy as soon as it answers, ready once a reconcile has
// succeeded, and stays ready when a later configuration is refused: that
// one is reported as an error while the last good one stays in force.
func TestReadinessFollowsTheFirstSuccessfulReconcile(t *testing.T) {
	m := NewMetrics(&source{}, slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()

	steps := []struct {
		do         func()
		wantReady  int
		wantErrors float64
	}{
		{do: func() {}, wantReady: http.StatusServiceUnavailable},
		{do: func() { m.ObserveReconcile(time.Now(), errors.New("interface nic1 not found")) }, wantReady: http.StatusServiceUnavailable, wantErrors: 1},
		{do: func() { m.ObserveReconcile(time.Now(), nil) }, wantReady: http.StatusOK, wantErrors: 1},
		{do: m.ObserveRejected, wantReady: http.StatusOK, wantErrors: 2},
	}
	for i, s := range steps {
		s.do()
		if got := probe(t, srv, "/healthz"); got != http.StatusOK {
			t.Errorf("step %d: /healthz answered %d", i, got)
		}
		if got := probe(t, srv, "/readyz"); got != s.wantReady {
			t.Errorf("step %d: /readyz answered %d, want %d", i, got, s.wantReady)
		}
		if got := testutil.ToFloat64(m.reconcileErrors); got != s.wantErrors {
			t.Errorf("step %d: mptcp_agent_reconcile_errors_total = %v, want %v", i, got, s.wantErrors)
		}
	}
	if n := testutil.CollectAndCount(m.reconcileDuration); n != 1 {
		t.Errorf("reconcile duration histogram has %d series, want 1", n)
	}
}

// Every counter of the datapath has a name of its own in
// mptcp_agent_datapath_events_total: a counter added to bpf/ without a name
// here fails this test rather than appearing as stat_<n>.
func TestEveryDatapathCounterIsExportedByName(t *testing.T) {
	privileged.RequireRoot(t)
	dp, err := datapath.Load(datapath.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	m := NewMetrics(&source{dp: dp, paths: map[uint32]string{1: "fabric-a", 2: "fabric-b"}}, slog.New(slog.DiscardHandler))

	stats, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	families, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string][]string{} // metric name -> label values
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			var labels []string
			for _, l := range metric.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			series[f.GetName()] = append(series[f.GetName()], strings.Join(labels, ","))
		}
	}
	if got := len(series["mptcp_agent_datapath_events_total"]); got != len(stats) {
		t.Errorf("mptcp_agent_datapath_events_total has %d series, the datapath %d counters", got, len(stats))
	}
	for s := range stats {
		if strings.HasPrefix(EventName(s), "stat_") {
			t.Errorf("datapath counter %d has no event name", uint32(s))
		}
	}
	for _, name := range []string{"mptcp_agent_path_tx_bytes_total", "mptcp_agent_path_tx_packets_total", "mptcp_agent_path_rx_bytes_total", "mptcp_agent_path_rx_packets_total"} {
		got := strings.Join(series[name], " ")
		if !strings.Contains(got, "path=fabric-a") || !strings.Contains(got, "path=fabric-b") || len(series[name]) != 2 {
			t.Errorf("%s: series %v, want one per configured path", name, series[name])
		}
	}
	if got := len(series["mptcp_agent_subflows"]); got != 4 {
		t.Errorf("mptcp_agent_subflows has %d series, want 2 paths x 2 roles: %v", got, series["mptcp_agent_subflows"])
	}
	for _, name := range []string{"mptcp_agent_connections", "mptcp_agent_endpoints", "mptcp_agent_path_managers", "mptcp_agent_observe_only", "mptcp_agent_reconcile_errors_total", "go_goroutines", "process_open_fds"} {
		if len(series[name]) == 0 {
			t.Errorf("%s is missing", name)
		}
	}
}

// mptcp_agent_observe_only follows the datapath's switch, read at scrape
// time.
func TestObserveOnlyGaugeFollowsTheDatapath(t *testing.T) {
	privileged.RequireRoot(t)
	dp, err := datapath.Load(datapath.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	m := NewMetrics(&source{dp: dp}, slog.New(slog.DiscardHandler))
	for _, on := range []bool{false, true, false} {
		if err := dp.SetObserveOnly(on); err != nil {
			t.Fatal(err)
		}
		want := "0"
		if on {
			want = "1"
		}
		exp := "# HELP mptcp_agent_observe_only " + observeOnlyHelp + "\n# TYPE mptcp_agent_observe_only gauge\nmptcp_agent_observe_only " + want + "\n"
		if err := testutil.GatherAndCompare(m.Gatherer(), strings.NewReader(exp), "mptcp_agent_observe_only"); err != nil {
			t.Errorf("observe-only %v: %v", on, err)
		}
	}
}

// Each configured path's state in the datapath is a gauge, and the agent's
// count of its losses a counter.
func TestPathDownIsExported(t *testing.T) {
	privileged.RequireRoot(t)
	dp, err := datapath.Load(datapath.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	src := &source{dp: dp, paths: map[uint32]string{1: "fabric-a", 2: "fabric-b"}, downs: map[uint32]uint64{2: 3},
		peers: []liveness.PeerState{
			{Path: 1, Peer: liveness.Peer{Node: "n2"}, State: liveness.Up},
			{Path: 2, Peer: liveness.Peer{Node: "n2"}, State: liveness.Down, Lost: 6, Downs: 2},
			{Path: 2, Peer: liveness.Peer{Node: "n3"}, State: liveness.Unknown, Lost: 20},
		},
		probes: liveness.Counters{ProbesSent: 10, EchoesReceived: 7, ProbesAnswered: 6, Ignored: 1}}
	m := NewMetrics(src, slog.New(slog.DiscardHandler))
	if err := dp.SetPathDown(2, true); err != nil {
		t.Fatal(err)
	}
	var exp strings.Builder
	exp.WriteString("# HELP mptcp_agent_path_down 1 while the path is down on this node (its NIC is missing, has no carrier, or flaps and is held down, or its probes reach none of its peers): " +
		"no new subflow is placed on it and its subflows detour over another path of their rule.\n# TYPE mptcp_agent_path_down gauge\n")
	exp.WriteString("mptcp_agent_path_down{path=\"fabric-a\"} 0\nmptcp_agent_path_down{path=\"fabric-b\"} 1\n")
	exp.WriteString("# HELP mptcp_agent_path_down_transitions_total Times the path went down on this node after having been up, since the agent started.\n" +
		"# TYPE mptcp_agent_path_down_transitions_total counter\n")
	exp.WriteString("mptcp_agent_path_down_transitions_total{path=\"fabric-a\"} 0\nmptcp_agent_path_down_transitions_total{path=\"fabric-b\"} 3\n")
	if err := testutil.GatherAndCompare(m.Gatherer(), strings.NewReader(exp.String()), "mptcp_agent_path_down", "mptcp_agent_path_down_transitions_total"); err != nil {
		t.Error(err)
	}
	// Per peer: a peer that never echoed has no up series, only its
	// (zero) count of losses, and no loss ratio (all its probes are
	// lost).
	exp.Reset()
	exp.WriteString("# HELP mptcp_agent_path_peer_up 1 while the peer node echoes the probes sent to it over the path, 0 once it stopped for the detect time; " +
		"absent while it has never echoed. A path whose peers are all 0 is down.\n# TYPE mptcp_agent_path_peer_up gauge\n")
	exp.WriteString("mptcp_agent_path_peer_up{path=\"fabric-a\",peer=\"n2\"} 1\nmptcp_agent_path_peer_up{path=\"fabric-b\",peer=\"n2\"} 0\n")
	exp.WriteString("# HELP mptcp_agent_path_peer_probe_loss_ratio Share of a window of 20 probes sent to the peer node over the path, the last whose echo can no longer come, " +
		"that were not answered; absent until the window is full and while the peer never echoed. An up peer is down for loss once 5 of the window's probes " +
		"sent since it was last up went unanswered.\n# TYPE mptcp_agent_path_peer_probe_loss_ratio gauge\n")
	exp.WriteString("mptcp_agent_path_peer_probe_loss_ratio{path=\"fabric-a\",peer=\"n2\"} 0\nmptcp_agent_path_peer_probe_loss_ratio{path=\"fabric-b\",peer=\"n2\"} 0.3\n")
	exp.WriteString("# HELP mptcp_agent_path_peer_down_transitions_total Times the peer node went down on the path (stopped echoing the probes sent over it, " +
		"or lost too many of their echoes), since the agent started.\n" +
		"# TYPE mptcp_agent_path_peer_down_transitions_total counter\n")
	exp.WriteString("mptcp_agent_path_peer_down_transitions_total{path=\"fabric-a\",peer=\"n2\"} 0\n" +
		"mptcp_agent_path_peer_down_transitions_total{path=\"fabric-b\",peer=\"n2\"} 2\n" +
		"mptcp_agent_path_peer_down_transitions_total{path=\"fabric-b\",peer=\"n3\"} 0\n")
	exp.WriteString("# HELP mptcp_agent_liveness_probes_sent_total Liveness probes this node sent to its peers, over all paths.\n" +
		"# TYPE mptcp_agent_liveness_probes_sent_total counter\nmptcp_agent_liveness_probes_sent_total 10\n")
	if err := testutil.GatherAndCompare(m.Gatherer(), strings.NewReader(exp.String()), "mptcp_agent_path_peer_up",
		"mptcp_agent_path_peer_probe_loss_ratio", "mptcp_agent_path_peer_down_transitions_total", "mptcp_agent_liveness_probes_sent_total"); err != nil {
		t.Error(err)
	}
}

// The record actor's counters reach Prometheus: per pod address, labelled
// with the pod that holds it (a pod's name may have dots, a namespace's
// not), and the LRU tables' fill; per connection only through the local
// API.
func TestRecordCountersAreExported(t *testing.T) {
	src, pod, sent := sourceWithAConnection(t)
	src.pods = []podnet.Pod{{Name: "apps.web.0", IPs: []netip.Addr{pod}}}
	dp := src.dp
	syn, ack := sent[0], sent[1]
	m := NewMetrics(src, slog.New(slog.DiscardHandler))
	want := fmt.Sprintf(`
# HELP mptcp_agent_pod_tx_packets_total TCP packets a selected pod address sent (GSO super-packets count once).
# TYPE mptcp_agent_pod_tx_packets_total counter
mptcp_agent_pod_tx_packets_total{address="10.244.1.11",namespace="apps",pod="web.0"} 2
# HELP mptcp_agent_pod_tx_bytes_total Bytes of TCP a selected pod address sent, counted at its host-side veth (Ethernet header included).
# TYPE mptcp_agent_pod_tx_bytes_total counter
mptcp_agent_pod_tx_bytes_total{address="10.244.1.11",namespace="apps",pod="web.0"} %d
# HELP mptcp_agent_table_entries Live entries of a datapath table (subflows, connections, police_buckets).
# TYPE mptcp_agent_table_entries gauge
mptcp_agent_table_entries{table="connections"} 1
mptcp_agent_table_entries{table="police_buckets"} 0
mptcp_agent_table_entries{table="subflows"} 1
# HELP mptcp_agent_table_evictions_total Entries a datapath table evicted to fit new ones (counted by the datapath; for the connection LRU, entries created minus those the agent deleted minus those live).
# TYPE mptcp_agent_table_evictions_total counter
mptcp_agent_table_evictions_total{table="connections"} 0
mptcp_agent_table_evictions_total{table="police_buckets"} 0
mptcp_agent_table_evictions_total{table="subflows"} 0
`, len(syn)+len(ack))
	if err := testutil.GatherAndCompare(m.Gatherer(), strings.NewReader(want),
		"mptcp_agent_pod_tx_packets_total", "mptcp_agent_pod_tx_bytes_total", "mptcp_agent_table_entries", "mptcp_agent_table_evictions_total"); err != nil {
		t.Fatal(err)
	}
	// The connection is in the datapath with its token; no metric names
	// it: a token lets anyone who reads it send joins for the connection.
	conns, err := dp.Connections()
	if err != nil || len(conns) != 1 || conns[0].Token == 0 {
		t.Fatalf("connections %+v, %v; want one with a token", conns, err)
	}
	assertNoTokenInMetrics(t, m, conns[0].Token)
	infos, err := connectionInfos(src)
	if err != nil || len(infos) != 1 || infos[0].TxBytes != uint64(len(syn)+len(ack)) {
		t.Fatalf("the local API's connections %+v, %v; want the connection with %d bytes sent", infos, err, len(syn)+len(ack))
	}

	// Per MPTCP subtype: the SYN and the ACK each carried an MP_CAPABLE;
	// every named subtype has its series, an unassigned one only once seen.
	unassigned := testpkt.Frame{Src: pod, Dst: netip.MustParseAddr("10.244.2.11"), TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 80, Seq: 2, Ack: 8, Flags: testpkt.ACK,
		Options: []byte{30, 4, 0x90, 0}}}.Bytes()
	if _, err := dp.Program(datapath.HookPodEgress).Run(&ebpf.RunOptions{Data: unassigned}); err != nil {
		t.Fatal(err)
	}
	var options strings.Builder
	options.WriteString(`
# HELP mptcp_agent_mptcp_options_total TCP packets the datapath parsed that carried a valid MPTCP option of the subtype (RFC 8684 names), once per packet and subtype: everything the selected pods' veths and the path NICs carry, selected or not.
# TYPE mptcp_agent_mptcp_options_total counter
`)
	for _, st := range []string{"ADD_ADDR", "DSS", "MP_CAPABLE", "MP_EXPERIMENTAL", "MP_FAIL", "MP_FASTCLOSE", "MP_JOIN", "MP_PRIO", "MP_TCPRST", "REMOVE_ADDR", "subtype-0x9"} {
		n := map[string]int{"MP_CAPABLE": 2, "subtype-0x9": 1}[st]
		fmt.Fprintf(&options, "mptcp_agent_mptcp_options_total{subtype=%q} %d\n", st, n)
	}
	if err := testutil.GatherAndCompare(m.Gatherer(), strings.NewReader(options.String()), "mptcp_agent_mptcp_options_total"); err != nil {
		t.Error(err)
	}
}

// assertNoTokenInMetrics fails if any series of m has a label named token or
// a label value that spells token, in hex (as the local API writes it) or in
// decimal.
func assertNoTokenInMetrics(t *testing.T, m *Metrics, token uint32) {
	t.Helper()
	families, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	spellings := []string{fmt.Sprintf("%08x", token), fmt.Sprintf("%x", token), fmt.Sprint(token)}
	series := 0
	for _, mf := range families {
		for _, metric := range mf.GetMetric() {
			series++
			for _, l := range metric.GetLabel() {
				if strings.Contains(strings.ToLower(l.GetName()), "token") {
					t.Errorf("%s has a label %s=%q", mf.GetName(), l.GetName(), l.GetValue())
				}
				for _, sp := range spellings {
					if strings.Contains(strings.ToLower(l.GetValue()), sp) {
						t.Errorf("%s{%s=%q} spells the token %s", mf.GetName(), l.GetName(), l.GetValue(), sp)
					}
				}
			}
		}
	}
	if series < 50 {
		t.Fatalf("only %d series gathered: the check saw too little to mean anything", series)
	}
}

// sourceWithAConnection loads the datapath of an agent with one path, one
// selected pod address and one MPTCP connection of that pod in its tables
// (an MP_CAPABLE SYN and the ACK that carries the keys, run through
// pod_egress), and returns the pod's address and the frames it sent.
func sourceWithAConnection(t *testing.T) (*source, netip.Addr, [][]byte) {
	t.Helper()
	privileged.RequireRoot(t)
	dp, err := datapath.Load(datapath.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	src := &source{dp: dp, paths: map[uint32]string{1: "fabric-a"}}
	if err := dp.SetRule(0, datapath.Rule{Paths: []uint32{1}}); err != nil {
		t.Fatal(err)
	}
	pod := netip.MustParseAddr("10.244.1.11")
	if err := dp.SetEndpoint(pod, 0); err != nil {
		t.Fatal(err)
	}
	syn := testpkt.Frame{Src: pod, Dst: netip.MustParseAddr("10.244.2.11"), TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 80, Seq: 1, Flags: testpkt.SYN, Options: testpkt.MPCapableSYN()}}.Bytes()
	ack := testpkt.Frame{Src: pod, Dst: netip.MustParseAddr("10.244.2.11"), TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 80, Seq: 2, Ack: 8, Flags: testpkt.ACK, Options: testpkt.MPCapableACK(1, 2)}}.Bytes()
	for _, f := range [][]byte{syn, ack} {
		if _, err := dp.Program(datapath.HookPodEgress).Run(&ebpf.RunOptions{Data: f}); err != nil {
			t.Fatal(err)
		}
	}
	return src, pod, [][]byte{syn, ack}
}

// A path manager waiting to restart is visible: mptcp_agent_path_managers
// counts only those listening, and each pod's shows whether it is up and how
// often it had to start again.
func TestPathManagerStatesAreExported(t *testing.T) {
	privileged.RequireRoot(t)
	dp, err := datapath.Load(datapath.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	m := NewMetrics(&source{dp: dp, pms: []podnet.PathManagerState{{Pod: "apps.a", Up: true}, {Pod: "apps.b", Restarts: 3}}}, slog.New(slog.DiscardHandler))
	exp := `
# HELP mptcp_agent_path_manager_restarts_total Times the pod's userspace path manager stopped without being asked to (its event socket failed) and had to start again.
# TYPE mptcp_agent_path_manager_restarts_total counter
mptcp_agent_path_manager_restarts_total{namespace="apps",pod="a"} 0
mptcp_agent_path_manager_restarts_total{namespace="apps",pod="b"} 3
# HELP mptcp_agent_path_manager_up 1 while the pod's userspace path manager listens to its MPTCP events, 0 while it waits to restart after its socket failed (the pod's new connections get no joins meanwhile).
# TYPE mptcp_agent_path_manager_up gauge
mptcp_agent_path_manager_up{namespace="apps",pod="a"} 1
mptcp_agent_path_manager_up{namespace="apps",pod="b"} 0
# HELP mptcp_agent_path_managers Userspace path managers running (listening to their pod's MPTCP events), one per pod whose rule has the agent open joins.
# TYPE mptcp_agent_path_managers gauge
mptcp_agent_path_managers 1
`
	if err := testutil.GatherAndCompare(m.Gatherer(), strings.NewReader(exp),
		"mptcp_agent_path_managers", "mptcp_agent_path_manager_up", "mptcp_agent_path_manager_restarts_total"); err != nil {
		t.Error(err)
	}
}
