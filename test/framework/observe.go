package framework

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// withDatapath opens the agent's pinned datapath (the maps the running
// agent uses, or the ones it left pinned) for the duration of fn.
func (a *Agent) withDatapath(fn func(*datapath.Datapath) error) error {
	dp, err := datapath.Load(datapath.Options{PinDir: a.Config.PinDir, MarkMask: a.Config.MarkMask})
	if err != nil {
		return err
	}
	defer dp.Close()
	return fn(dp)
}

// DatapathStats reads the counters of the agent's pinned datapath.
func (a *Agent) DatapathStats() (map[datapath.Stat]uint64, error) {
	var out map[datapath.Stat]uint64
	err := a.withDatapath(func(dp *datapath.Datapath) (err error) { out, err = dp.Stats(); return })
	return out, err
}

// Subflows reads the subflow table of the agent's pinned datapath, in this
// release's layout whichever release pinned it (an upgrade test reads the
// previous release's).
func (a *Agent) Subflows() ([]datapath.Subflow, error) {
	return datapath.PinnedSubflows(a.Config.PinDir)
}

// Connections reads the connection table of the agent's pinned datapath.
func (a *Agent) Connections() ([]datapath.Connection, error) {
	var out []datapath.Connection
	err := a.withDatapath(func(dp *datapath.Datapath) (err error) { out, err = dp.Connections(); return })
	return out, err
}

// Endpoints reads the selected pod addresses of the agent's pinned datapath.
func (a *Agent) Endpoints() (map[string]uint32, error) {
	out := map[string]uint32{}
	err := a.withDatapath(func(dp *datapath.Datapath) error {
		eps, err := dp.Endpoints()
		for addr, rule := range eps {
			out[addr.String()] = rule
		}
		return err
	})
	return out, err
}

// Attachments lists the links the agent has pinned.
func (a *Agent) Attachments() ([]datapath.Attachment, error) {
	var out []datapath.Attachment
	err := a.withDatapath(func(dp *datapath.Datapath) (err error) { out, err = dp.Attachments(); return })
	return out, err
}

// Kill ends the agent with SIGKILL, as a crash or an OOM kill would: no
// cleanup of any kind runs.
func (a *Agent) Kill() error {
	if err := a.Proc.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-a.Proc.Done():
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("agent on node %d (pid %d) survived SIGKILL", a.Node.Index, a.Proc.PID)
	}
}

// Reload sends SIGHUP, so the agent re-reads its configuration file.
func (a *Agent) Reload() error { return a.Proc.Signal(syscall.SIGHUP) }

// Get sends GET path to the agent's metrics address from inside the node
// namespace, where the agent listens on loopback. The connection is opened
// on a thread switched into the namespace; the request itself then runs on
// that connection from anywhere. With MetricsToken it goes over TLS with the
// token, as a scraper of an agent with -metrics-auth does; the agent's
// certificate is not verified (a bed's agents make self-signed ones).
func (a *Agent) Get(path string) (status int, body []byte, err error) {
	if a.MetricsAddr == "" {
		return 0, nil, fmt.Errorf("agent on node %d serves no metrics", a.Node.Index)
	}
	var conn net.Conn
	err = netnsutil.Do("/var/run/netns/"+a.Node.NetNS, func() (err error) {
		conn, err = net.DialTimeout("tcp", a.MetricsAddr, 2*time.Second)
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	scheme := "http"
	if a.MetricsToken != "" {
		scheme = "https"
		conn = tls.Client(conn, &tls.Config{InsecureSkipVerify: true})
	}
	req, err := http.NewRequest(http.MethodGet, scheme+"://"+a.MetricsAddr+path, http.NoBody)
	if err != nil {
		return 0, nil, err
	}
	if a.MetricsToken != "" {
		req.Header.Set("Authorization", "Bearer "+a.MetricsToken)
	}
	req.Close = true
	if err := req.Write(conn); err != nil {
		return 0, nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// Scrape is one scrape of an agent's /metrics, by metric family name.
type Scrape map[string]*dto.MetricFamily

// Scrape reads and parses the agent's /metrics.
func (a *Agent) Scrape() (Scrape, error) {
	status, body, err := a.Get("/metrics")
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("/metrics answered %d: %s", status, body)
	}
	return ParseScrape(body)
}

// WaitForMetric waits until the agent's series name{labels} has value
// want, for at most within.
func (a *Agent) WaitForMetric(name string, want float64, within time.Duration, labels ...string) error {
	deadline := time.Now().Add(within)
	for {
		s, err := a.Scrape()
		if err != nil {
			return fmt.Errorf("node %d: %w", a.Node.Index, err)
		}
		v, ok := s.Value(name, labels...)
		if ok && v == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %d: %s%v = %v (present %v), want %v within %v", a.Node.Index, name, labels, v, ok, want, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ParseScrape parses a /metrics page in the Prometheus text format.
func ParseScrape(body []byte) (Scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parsing /metrics: %w", err)
	}
	return Scrape(families), nil
}

// Value sums the series of metric name whose labels match labels (name,
// value pairs); a histogram counts its observations. ok is false when no
// series matches.
func (s Scrape) Value(name string, labels ...string) (v float64, ok bool) {
	f := s[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
			}
			match = match && found
		}
		if !match {
			continue
		}
		ok = true
		switch {
		case m.Counter != nil:
			v += m.GetCounter().GetValue()
		case m.Gauge != nil:
			v += m.GetGauge().GetValue()
		case m.Histogram != nil:
			v += float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			v += m.GetUntyped().GetValue()
		}
	}
	return v, ok
}

// Leftovers lists what `agent -uninstall` should have removed from the node
// and did not: rules in the agent's priority range or with a fwmark,
// routes with the agent's protocol, pins, state.
func (a *Agent) Leftovers() error {
	var errs []error
	out, err := a.bed.Command(a.Node.NetNS, "ip", "rule", "show").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip rule: %w: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "3099:") || strings.Contains(line, "fwmark") {
			errs = append(errs, fmt.Errorf("rule left: %s", line))
		}
	}
	out, _ = a.bed.Command(a.Node.NetNS, "ip", "route", "show", "table", "all", "proto", "0x4d").CombinedOutput()
	if s := strings.TrimSpace(string(out)); s != "" {
		errs = append(errs, fmt.Errorf("routes left:\n%s", s))
	}
	if out, err := exec.Command("find", a.Config.PinDir, a.Config.StateDir).CombinedOutput(); err == nil {
		errs = append(errs, fmt.Errorf("pins or state left:\n%s", out))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node %d: %w", a.Node.Index, err)
	}
	return nil
}

// ClassifiedResets reads the TCP resets of captures, and the FINs that tell a
// connection's teardown, in one tshark pass over each capture's control
// segments (testbed.ControlSegments): every reset (as Resets lists them),
// those whose sender had sent a FIN on the same 4-tuple before, in any of
// the captures (a connection's teardown, not a failure), and the others.
// When an MPTCP connection closes while one of its subflows still carries
// data that the connection already has (the subflow's own retransmissions
// of segments that MPTCP sent again on another subflow after a failure),
// the closing side's kernel finds unread data on that subflow at close and
// resets it, after its FIN, and answers every segment still arriving with
// another reset (docs/testing.md, "Failover").
func ClassifiedResets(files []testbed.CaptureFile) (all, teardown, other []string, err error) {
	control, err := testbed.ControlSegments(files)
	if err != nil {
		return nil, nil, nil, err
	}
	return classifyResets(testbed.ControlFiles(control))
}

// classifyResets is ClassifiedResets on captures already cut to their
// control segments.
func classifyResets(files []testbed.CaptureFile) (all, teardown, other []string, err error) {
	fins := map[string]float64{} // "src sport dst dport" -> the first FIN's time
	for _, f := range files {
		b, err := exec.Command("tshark", "-r", f.Path, "-Y", "tcp.flags.reset == 1 || tcp.flags.fin == 1",
			"-T", "fields", "-E", "separator=/s", "-e", "tcp.flags.reset", "-e", "tcp.flags.fin",
			"-e", "frame.time_epoch", "-e", "ip.src", "-e", "tcp.srcport", "-e", "ip.dst", "-e", "tcp.dstport",
			"-e", "tcp.flags.str", "-e", "tcp.seq_raw", "-e", "tcp.len", "-e", "tcp.options.mptcp.subtype", "-e", "tcp.options.mptcp.rst_reason").Output()
		if err != nil {
			return all, nil, nil, fmt.Errorf("tshark -r %s: %w", f.Path, err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			rst, rest, _ := strings.Cut(line, " ")
			fin, rest, _ := strings.Cut(rest, " ")
			if isSet(rst) {
				all = append(all, fmt.Sprintf("node %d nic%d: %s", f.Node, f.NIC, rest))
			}
			fields := strings.Fields(rest)
			if !isSet(fin) || len(fields) < 5 {
				continue
			}
			at, err := strconv.ParseFloat(fields[0], 64)
			if err != nil {
				continue
			}
			key := strings.Join(fields[1:5], " ")
			if first, ok := fins[key]; !ok || at < first {
				fins[key] = at
			}
		}
	}
	teardown, other = splitTeardown(fins, all)
	return all, teardown, other, nil
}

// isSet reads a flag as tshark prints it.
func isSet(field string) bool { return field == "1" || field == "True" }

// splitTeardown splits resets (as Resets lists them) by whether fins
// ("src sport dst dport" to the time of its first FIN) holds a FIN their
// sender sent on the same 4-tuple no later.
func splitTeardown(fins map[string]float64, resets []string) (teardown, other []string) {
	for _, r := range resets {
		// "node N nicK: time src sport dst dport flags ..."
		_, rest, _ := strings.Cut(r, ": ")
		fields := strings.Fields(rest)
		if len(fields) >= 5 {
			at, perr := strconv.ParseFloat(fields[0], 64)
			if fin, ok := fins[strings.Join(fields[1:5], " ")]; perr == nil && ok && fin <= at {
				teardown = append(teardown, r)
				continue
			}
		}
		other = append(other, r)
	}
	return teardown, other
}

// UnexpectedResets is the resets of captures but the teardown's
// (ClassifiedResets), which it logs as known and explained.
func UnexpectedResets(t testing.TB, files []testbed.CaptureFile) ([]string, error) {
	t.Helper()
	all, teardown, other, err := ClassifiedResets(files)
	if err != nil {
		return all, err
	}
	if len(teardown) > 0 {
		t.Logf("known: %d resets at a connection's teardown, after their sender's FIN (a subflow still retransmitting data "+
			"the connection already had):\n%s", len(teardown), strings.Join(teardown, "\n"))
	}
	return other, nil
}

// TCXIngressPrograms names the programs attached through TCX to the TC
// ingress of ifname in node's namespace, whoever attached them and whether
// pinned or not: the kernel's own list (BPF_PROG_QUERY), not the agent's
// pins. (Debian 12's bpftool 7.1 does not list TCX.)
func TCXIngressPrograms(node *testbed.Node, ifname string) ([]string, error) {
	return tcxProgramNames(node, ifname, ebpf.AttachTCXIngress)
}

// tcxProgramNames names the programs on hook (TCX ingress or egress) of
// ifname in node's namespace, from the kernel's list.
func tcxProgramNames(node *testbed.Node, ifname string, hook ebpf.AttachType) ([]string, error) {
	var names []string
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		iface, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: iface.Index, Attach: hook})
		if err != nil {
			return err
		}
		for _, p := range res.Programs {
			prog, err := ebpf.NewProgramFromID(p.ID)
			if err != nil {
				return err
			}
			info, err := prog.Info()
			prog.Close()
			if err != nil {
				return err
			}
			names = append(names, info.Name)
		}
		return nil
	})
	return names, err
}

// TCXIngressLinks lists the IDs of the TCX links on the TC ingress of
// ifname in node's namespace, from the kernel's list (BPF_PROG_QUERY). A
// link that is updated with another program keeps its ID; a detach and
// attach makes a new one, so equal lists mean nothing was re-attached.
func TCXIngressLinks(node *testbed.Node, ifname string) ([]link.ID, error) {
	var ids []link.ID
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		iface, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: iface.Index, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		for _, p := range res.Programs {
			if id, ok := p.LinkID(); ok {
				ids = append(ids, id)
			}
		}
		return nil
	})
	return ids, err
}
