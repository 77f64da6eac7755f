package xdpdrop

import (
	"flag"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

var (
	packets = flag.Uint("xdpdrop.packets", 2_000_000, "flood packets per measured run")
	rounds  = flag.Int("xdpdrop.rounds", 7, "rounds: every case runs once per round, in an order rotated each round")
)

// warmup packets run before each measured run, unmeasured: the program's
// first packets, the frames' pages, the datapath's tables.
const warmup = 100_000

// env is what the cases share: the bed, the programs and the datapath.
type env struct {
	*bed
	objs *dropObjects
	dp   *datapath.Datapath
}

// floodCase is one way the node meets the flood.
type floodCase struct {
	name string
	// key names the case in the benchmark's metrics.
	key string
	// nowhere: the flood's frames are dropped on the peer's side.
	nowhere bool
	// attach puts the case's program on the node's interface and returns
	// what detaches it.
	attach func(tb testing.TB, e *env) func()
	// handled is the node's count of flood packets the case's stage took:
	// a run must move it by as many packets as the flood sent.
	handled func(tb testing.TB, e *env) uint64
}

// attachIn attaches in the node's namespace, where its ifindex names its
// veth end.
func attachIn(tb testing.TB, e *env, attach func() (link.Link, error)) func() {
	tb.Helper()
	var l link.Link
	testutil.InNetNS(tb, e.node, func() {
		var err error
		if l, err = attach(); err != nil {
			tb.Error(err)
		}
	})
	if tb.Failed() {
		tb.FailNow()
	}
	return func() { l.Close() }
}

func noProgram(testing.TB, *env) func() { return func() {} }

func counted(c uint32) func(tb testing.TB, e *env) uint64 {
	return func(tb testing.TB, e *env) uint64 { return count(tb, e.objs, c) }
}

func xdpCase(name, key string, mode link.XDPAttachFlags) floodCase {
	return floodCase{name: name, key: key, attach: func(tb testing.TB, e *env) func() {
		return attachIn(tb, e, func() (link.Link, error) {
			return link.AttachXDP(link.XDPOptions{Program: e.objs.XdpDrop, Interface: e.nodeIf, Flags: mode})
		})
	}, handled: counted(counterXDPDropped)}
}

func tcxCase(name, key string, prog func(e *env) *ebpf.Program, handled func(tb testing.TB, e *env) uint64) floodCase {
	return floodCase{name: name, key: key, attach: func(tb testing.TB, e *env) func() {
		return attachIn(tb, e, func() (link.Link, error) {
			return link.AttachTCX(link.TCXOptions{Program: prog(e), Interface: e.nodeIf, Attach: ebpf.AttachTCXIngress})
		})
	}, handled: handled}
}

// The cases; the first is the baseline, the last the sender's share of
// every other.
var cases = []floodCase{
	{name: "no program: the stack drops it (blackhole route)", key: "stack", attach: noProgram,
		handled: func(tb testing.TB, e *env) uint64 { return e.ipInReceives(tb) }},
	tcxCase("TC drop (TCX ingress, TC_ACT_SHOT)", "tc", func(e *env) *ebpf.Program { return e.objs.TcDrop }, counted(counterTCDropped)),
	xdpCase("XDP drop, native (veth driver mode)", "xdp", link.XDPDriverMode),
	xdpCase("XDP drop, generic (skb mode)", "xdp-generic", link.XDPGenericMode),
	tcxCase("nic_ingress today: stages the join, then the stack drops it", "nic_ingress",
		func(e *env) *ebpf.Program { return e.dp.Program(datapath.HookNICIngress) },
		func(tb testing.TB, e *env) uint64 {
			st, err := e.dp.Stats()
			if err != nil {
				tb.Fatal(err)
			}
			return st[datapath.StatArrivalStaged]
		}),
	{name: "sender alone: the flood built, dropped before the veth", key: "sender", nowhere: true, attach: noProgram,
		handled: func(tb testing.TB, e *env) uint64 { return count(tb, e.objs, counterFloodSent) }},
}

// loadDatapath loads the project's datapath and configures it as the agent
// does a node whose path 1 is the veth and whose pod the flood's target is,
// selected by a rule over that path: nic_ingress then stages every join SYN
// to the pod (arrivals) and passes it.
func loadDatapath(tb testing.TB, nodeIf int) *datapath.Datapath {
	tb.Helper()
	dp, err := datapath.Load(datapath.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { dp.Close() })
	if err := dp.SetRule(0, datapath.Rule{Paths: []uint32{1}}); err != nil {
		tb.Fatal(err)
	}
	if err := dp.SetEndpoint(podAddr, 0); err != nil {
		tb.Fatal(err)
	}
	if err := dp.SetNIC(nodeIf, 1); err != nil {
		tb.Fatal(err)
	}
	return dp
}

// BenchmarkJoinSYNFlood floods the node with join SYNs to a pod and
// measures the CPU per packet of each case, rounds times, the cases
// interleaved. With BENCH_REPORT=<file> it rewrites that file's section
// "XDP or TC for dropping a flood".
func BenchmarkJoinSYNFlood(b *testing.B) {
	load1 := loadAverage()
	w := newBed(b)
	e := &env{bed: w, objs: load(b)}
	e.dp = loadDatapath(b, w.nodeIf)
	frame := joinSYN(peerAddr, podAddr)
	cpu := runtime.NumCPU() - 1
	results := map[string][]float64{}
	for range b.N {
		for r := range *rounds {
			for i := range cases {
				c := cases[(i+r)%len(cases)]
				ns := measure(b, e, c, frame, cpu)
				results[c.key] = append(results[c.key], ns)
			}
		}
	}
	for _, c := range cases {
		_, med := testutil.MinMedian(results[c.key])
		b.ReportMetric(med, "ns/pkt-"+c.key)
	}
	if path := os.Getenv("BENCH_REPORT"); path != "" {
		if err := writeReport(path, results, load1, len(frame)); err != nil {
			b.Fatal(err)
		}
	}
}

// measure runs one case: attach, warm up, flood, check that the case's
// stage took every packet, detach. It returns the CPU per packet.
func measure(tb testing.TB, e *env, c floodCase, frame []byte, cpu int) float64 {
	tb.Helper()
	prog := e.objs.Flood
	if c.nowhere {
		prog = e.objs.FloodNowhere
	}
	detach := c.attach(tb, e)
	defer detach()
	e.flood(tb, prog, frame, warmup, cpu)
	h0, s0 := c.handled(tb, e), count(tb, e.objs, counterFloodSent)
	u := e.flood(tb, prog, frame, uint32(*packets), cpu)
	h1, s1 := c.handled(tb, e), count(tb, e.objs, counterFloodSent)
	sent, handled := s1-s0, h1-h0
	if sent == 0 || handled != sent {
		tb.Fatalf("%s: the flood sent %d packets, the case's stage took %d", c.name, sent, handled)
	}
	ns := float64(u.cpu().Nanoseconds()) / float64(sent)
	tb.Logf("%-12s %7.1f ns/pkt CPU (thread %v, ksoftirqd %v), wall %7.1f ns/pkt", c.key, ns,
		u.thread.Round(time.Millisecond), u.ksoftirqd.Round(time.Millisecond), float64(u.wall.Nanoseconds())/float64(sent))
	return ns
}
