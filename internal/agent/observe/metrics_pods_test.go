package observe

import (
	"context"
	"log/slog"
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

func TestParseNetstatReadsOneGroup(t *testing.T) {
	in := `TcpExt: SyncookiesSent SyncookiesRecv
TcpExt: 1 2
MPTcpExt: MPCapableSYNRX DataCsumErr MPFailTx
MPTcpExt: 7 3 1
`
	got, err := parseNetstat(strings.NewReader(in), "MPTcpExt")
	if err != nil {
		t.Fatal(err)
	}
	if got["DataCsumErr"] != 3 || got["MPFailTx"] != 1 || got["MPCapableSYNRX"] != 7 || len(got) != 3 {
		t.Errorf("parsed %v", got)
	}
	for name, bad := range map[string]string{
		"missing group":  "TcpExt: A\nTcpExt: 1\n",
		"short values":   "MPTcpExt: A B\nMPTcpExt: 1\n",
		"not a number":   "MPTcpExt: A\nMPTcpExt: x\n",
		"names, no line": "MPTcpExt: A\n",
	} {
		if _, err := parseNetstat(strings.NewReader(bad), "MPTcpExt"); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// connectOnLoopback makes one connection on the loopback of the namespace
// at path, from an MPTCP client to a server that speaks MPTCP or, when
// serverMPTCP is false, plain TCP (the client then falls back).
func connectOnLoopback(t *testing.T, path string, serverMPTCP bool) {
	t.Helper()
	err := netnsutil.Do(path, func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(serverMPTCP)
		ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		var d net.Dialer
		d.SetMultipathTCP(true)
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			return err
		}
		return s.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// loopbackNetNS is a fresh namespace with its loopback up, by path.
func loopbackNetNS(t *testing.T) string {
	t.Helper()
	name := testutil.NetNS(t, "mptmib-")
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	return "/var/run/netns/" + name
}

// The agent reads a pod's counters, not its own: one MPTCP connection made
// on the loopback of a fresh namespace shows there as exactly one
// MP_CAPABLE SYN received.
func TestPodMPTCPCountersReadThePodsNamespace(t *testing.T) {
	path := loopbackNetNS(t)
	connectOnLoopback(t, path, true)
	mib, err := podMPTCPCounters(path)
	if err != nil {
		t.Fatal(err)
	}
	if mib["MPCapableSYNRX"] != 1 {
		t.Errorf("MPCapableSYNRX = %v in the namespace of one MPTCP connection, want 1 (counters: %v)", mib["MPCapableSYNRX"], mib)
	}
}

// A pod's connection that falls back to TCP is counted under its reason,
// on that pod only; a pod whose namespace cannot be read is reported as
// such and costs the other pods nothing.
func TestAPodsFallbackIsCountedByReason(t *testing.T) {
	path := loopbackNetNS(t)
	// The server speaks plain TCP: its SYN-ACK carries no MP_CAPABLE.
	connectOnLoopback(t, path, false)
	src := &source{pods: []podnet.Pod{
		{Name: "tenant-a.web", NetNS: path},
		{Name: "tenant-b.gone", NetNS: "/var/run/netns/mptmib-never-made"},
	}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newPodMPTCPCollector(src, slog.New(slog.DiscardHandler)))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{} // name{labels} -> value
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "mptcp_agent_pod_mptcp_") {
			continue
		}
		for _, metric := range f.GetMetric() {
			var labels []string
			for _, l := range metric.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			got[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = metric.GetCounter().GetValue() + metric.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"mptcp_agent_pod_mptcp_fallbacks_total{namespace=tenant-a,pod=web,reason=mp_capable_syn_ack}": 1,
		"mptcp_agent_pod_mptcp_fallbacks_total{namespace=tenant-a,pod=web,reason=mp_capable_ack}":     0,
		"mptcp_agent_pod_mptcp_data_checksum_errors_total{namespace=tenant-a,pod=web}":                0,
		"mptcp_agent_pod_mptcp_counters_read_errors{namespace=tenant-a,pod=web}":                      0,
		"mptcp_agent_pod_mptcp_counters_read_errors{namespace=tenant-b,pod=gone}":                     1,
	}
	for series, v := range want {
		if g, ok := got[series]; !ok || g != v {
			t.Errorf("%s = %v (exported: %t), want %v", series, g, ok, v)
		}
	}
	for series := range got {
		if strings.Contains(series, "pod=tenant-b/gone") && !strings.Contains(series, "counters_read_errors") {
			t.Errorf("%s exported for a pod whose counters could not be read", series)
		}
	}
}
