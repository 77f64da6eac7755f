package framework

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// The four ways of moving one pod's bulk transfer to a pod on another node
// that the walking skeleton compares, in the order they run.
const (
	ScenarioSinglePath  = "TCP, single path"
	ScenarioKernelMPTCP = "MPTCP, kernel routing"
	ScenarioHandRouted  = "MPTCP, hand-written ip rules"
	// ScenarioHandRoutedChecksums is the hand-written rules with DSS
	// checksums on in both pods, as the agent's defaults set them
	// (CompareOptions.HandRoutedChecksums).
	ScenarioHandRoutedChecksums = "MPTCP, hand-written, checksums on"
	ScenarioAgent               = "MPTCP, mptcp-operator agent"
)

// Measurement is one scenario's transfer.
type Measurement struct {
	Scenario string
	// GoodputBps is what the server received per second over the window,
	// summed over connections.
	GoodputBps float64
	// NICMbps[k-1] is the client node's transmit rate on nic<k> over the
	// same window: where the data left.
	NICMbps []float64
	// CPUSeconds is the machine's busy CPU time over the same window, every
	// CPU and every kind (user, system, interrupts, softirq): the bed's
	// nodes share the machine's CPUs, so sender and receiver are both in it.
	CPUSeconds float64
	// Start and End bound the whole transfer.
	Start, End time.Time
	// Stalled: a connection made no progress for 5 s, every byte that
	// arrived as sent (CompareOptions.KeepStalls); nothing else is set.
	Stalled bool
}

// CompareOptions size the comparison.
type CompareOptions struct {
	Binaries
	// Duration of each transfer; the goodput window is Duration-Warmup-1s.
	Duration, Warmup time.Duration
	// Conns is the number of concurrent connections per transfer.
	Conns int
	// Log receives progress lines (may be nil).
	Log func(format string, args ...any)
	// SkipAgent stops before the agent scenario, for a caller that runs it
	// another way (the demo runs it through the API server).
	SkipAgent bool
	// SkipKernelRouting leaves out the kernel-routing scenario, for a
	// caller that compares only the others (it still announces the ports
	// the hand-written rules route).
	SkipKernelRouting bool
	// SkipSinglePath leaves out single-path TCP, for a caller that
	// measured it once and repeats only the multipath scenarios (its
	// rounds differ by less than 1 %).
	SkipSinglePath bool
	// HandRoutedChecksums adds the hand-written rules with DSS checksums
	// on (ScenarioHandRoutedChecksums): the agent's defaults against the
	// same socket options without the agent.
	HandRoutedChecksums bool
	// KeepStalls records a transfer whose connections only stalled as a
	// Measurement that says so, and goes on: a benchmark counts stalls
	// as an outcome. A changed or broken stream is still an error.
	KeepStalls bool
}

// compareRuns counts the comparisons this process has run, so that each
// announces ports of its own.
var compareRuns atomic.Uint32

// signalPorts are n ports for the server to announce, new to each
// comparison: a later comparison on the same bed could not announce a port
// again while a socket of an earlier one still held it (the kernel refused
// the endpoint's listener with EADDRINUSE for 5 s, once in CI; most likely
// a socket of the earlier round's joins).
func signalPorts(n int) []int {
	base := 5301 + 16*int((compareRuns.Add(1)-1)%64)
	ports := make([]int, n)
	for i := range ports {
		ports[i] = base + i
	}
	return ports
}

// Compare runs every scenario on bed, one after the other, from pod 1 of
// node 1 to pod 1 of node 2, and leaves the bed as it found it.
func Compare(ctx context.Context, bed *testbed.Bed, o CompareOptions) ([]Measurement, error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if bed.Config.NICs < 2 {
		return nil, errors.New("comparison needs at least 2 NICs")
	}
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	ports := signalPorts(bed.Config.NICs - 1)
	var out []Measurement
	run := func(name string, mptcp bool, port int) error {
		o.Log("running %q for %v", name, o.Duration)
		m, err := Transfer(ctx, bed, o, client, server, port, mptcp)
		var terr *testbed.TrafficError
		if o.KeepStalls && errors.As(err, &terr) && terr.OnlyStalled() {
			o.Log("%s: %v", name, err)
			m, err = Measurement{Stalled: true}, nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		m.Scenario = name
		out = append(out, m)
		return nil
	}

	if !o.SkipSinglePath {
		if err := run(ScenarioSinglePath, false, 5201); err != nil {
			return out, err
		}
	}

	// The kernel's own path manager: the server announces one extra port
	// per extra NIC and the client joins them. Nothing routes the joins.
	if err := bed.ConfigureSignalPorts(server, ports); err != nil {
		return out, err
	}
	if err := bed.ConfigureClientLimits(client, len(ports), len(ports)); err != nil {
		return out, err
	}
	if !o.SkipKernelRouting {
		if err := run(ScenarioKernelMPTCP, true, 5202); err != nil {
			return out, err
		}
	}

	// The baseline an expert writes by hand: one rule per announced port.
	if err := bed.HandRoute(ports); err != nil {
		return out, err
	}
	if err := run(ScenarioHandRouted, true, 5203); err != nil {
		return out, err
	}
	if o.HandRoutedChecksums {
		if err := withChecksums(func() error { return run(ScenarioHandRoutedChecksums, true, 5204) }, client, server); err != nil {
			return out, err
		}
	}
	if err := bed.RemoveHandRoute(); err != nil {
		return out, err
	}

	if o.SkipAgent {
		return out, nil
	}
	// The agent: nobody writes routes; it configures the pods itself.
	agents, err := StartAgents(ctx, bed, o.Agent, mptcpv1alpha1.CompiledRule{})
	defer func() {
		for _, a := range agents {
			if uerr := a.Uninstall(context.Background()); uerr != nil {
				o.Log("uninstalling agent: %v", uerr)
			}
		}
	}()
	if err != nil {
		return out, err
	}
	if err := run(ScenarioAgent, true, 5204); err != nil {
		return out, err
	}
	return out, nil
}

// Transfer runs one bulk transfer of o.Conns connections from client to
// server:port, checks every byte arrived intact, and measures goodput and the
// client node's per-NIC transmit rates over the same window.
func Transfer(ctx context.Context, bed *testbed.Bed, o CompareOptions, client, server *testbed.Pod, port int, mptcp bool) (Measurement, error) {
	window := o.Duration - o.Warmup - time.Second
	if window <= 0 {
		return Measurement{}, fmt.Errorf("duration %v leaves no goodput window after warmup %v", o.Duration, o.Warmup)
	}
	srv, err := bed.StartTrafficServer(ctx, o.Traffic, server, port, mptcp, "-warmup", o.Warmup.String(), "-window", window.String())
	if err != nil {
		return Measurement{}, err
	}
	defer func() { _ = srv.Stop() }()

	node := client.Node
	type snapshot struct {
		tx  []uint64
		cpu float64
	}
	take := func() (snapshot, error) {
		s := snapshot{tx: make([]uint64, len(node.NICs))}
		var err error
		if s.cpu, err = busyCPUSeconds(); err != nil {
			return s, err
		}
		for _, nic := range node.NICs {
			_, tx, err := bed.NICCounters(node, nic.Index)
			if err != nil {
				return s, err
			}
			s.tx[nic.Index-1] = tx
		}
		return s, nil
	}
	// The counters are read over the goodput window, measured from the
	// transfer's start as the server measures from the first byte.
	type result struct {
		a, b snapshot
		err  error
	}
	resc := make(chan result, 1)
	m := Measurement{Start: time.Now()}
	go func() {
		var r result
		time.Sleep(o.Warmup)
		if r.a, r.err = take(); r.err == nil {
			time.Sleep(window)
			r.b, r.err = take()
		}
		resc <- r
	}()
	sent, sendErr := bed.Send(ctx, o.Traffic, client, netip.AddrPortFrom(server.Addr, uint16(port)), mptcp,
		"-conns", fmt.Sprint(o.Conns), "-duration", o.Duration.String(), "-seed", fmt.Sprint(port))
	m.End = time.Now()
	if len(sent) == 0 {
		return m, fmt.Errorf("the sender reported no connection: %w", sendErr)
	}
	// The sender has seen the server close every connection, and the
	// server reports a connection before it closes it.
	if err := srv.Stop(); err != nil {
		return m, err
	}
	got, err := srv.Reports()
	if err != nil {
		return m, err
	}
	byRemote, err := testbed.MatchReports(sent, got)
	if err != nil {
		return m, err
	}
	for _, snt := range sent {
		m.GoodputBps += byRemote[snt.Local].GoodputBps
	}
	r := <-resc
	if r.err != nil {
		return m, r.err
	}
	m.CPUSeconds = r.b.cpu - r.a.cpu
	m.NICMbps = make([]float64, len(node.NICs))
	for i := range m.NICMbps {
		m.NICMbps[i] = float64(r.b.tx[i]-r.a.tx[i]) * 8 / window.Seconds() / 1e6
	}
	return m, nil
}

// busyCPUSeconds is the CPU time the machine has spent busy since it
// booted, over all CPUs (/proc/stat's first line: every field but idle and
// iowait; guest time is already in user).
func busyCPUSeconds() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat begins %q: want the cpu line", line)
	}
	var busy uint64
	// user nice system idle iowait irq softirq steal
	for i, f := range fields[1:9] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat cpu field %d: %w", i+1, err)
		}
		if i != 3 && i != 4 {
			busy += v
		}
	}
	return float64(busy) / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc/stat: 100 on every Linux
// architecture the project builds for.
const clockTicks = 100

// withChecksums runs f with DSS checksums on in pods' namespaces, and puts
// back what each had.
func withChecksums(f func() error, pods ...*testbed.Pod) (err error) {
	const key = "net.mptcp.checksum_enabled"
	for _, p := range pods {
		ns := "/var/run/netns/" + p.NetNS
		was, rerr := netnsutil.ReadSysctl(ns, key)
		if rerr != nil {
			return rerr
		}
		if werr := netnsutil.WriteSysctl(ns, key, "1"); werr != nil {
			return werr
		}
		defer func() { err = errors.Join(err, netnsutil.WriteSysctl(ns, key, was)) }()
	}
	return f()
}
