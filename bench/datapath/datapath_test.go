// Package datapath measures what the datapath costs per packet: the TC
// programs run in the kernel on crafted packets through BPF_PROG_TEST_RUN,
// and the kernel's own clock says how long one run takes, next to an empty TC
// program measured the same way in the same run.
//
//	make bench    (go test -count=5 -run '^$' -bench . -benchtime=1x ./bench/datapath/)
//
// With BENCH_REPORT=<file> the minimum, median and ratio to the empty program
// of every case are written to that file's "Datapath: nanoseconds per packet"
// section.
package datapath

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// repeat is how many times the kernel runs a program per syscall for the
// cases whose every run takes the same path.
const repeat = 1_000_000

// placements is how many single runs measure a placement: each run changes
// the maps, so each needs the state reset before it.
const placements = 20_000

var (
	clientPod = netip.MustParseAddr("10.244.1.11")
	serverPod = netip.MustParseAddr("10.244.2.11")
)

const (
	clientKey uint64 = 0x0a0b0c0d0e0f1011
	serverKey uint64 = 0x0102030405060708
)

// results collects ns/packet per case over every run of the process, for
// the report.
var results = struct {
	sync.Mutex
	ns map[string][]float64
}{ns: map[string][]float64{}}

func record(name string, ns float64) {
	results.Lock()
	defer results.Unlock()
	results.ns[name] = append(results.ns[name], ns)
}

// emptyProgram is the baseline: a TC program that returns TCX_NEXT and does
// nothing else, built here so it needs no clang.
func emptyProgram(b *testing.B) *ebpf.Program {
	b.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "empty",
		Type:         ebpf.SchedCLS,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { prog.Close() })
	return prog
}

func tokenOf(key uint64) uint32 {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], key)
	h := sha256.Sum256(k[:])
	return binary.BigEndian.Uint32(h[:4])
}

func frame(src, dst netip.Addr, sport, dport uint16, flags uint8, opts, payload []byte) []byte {
	return testpkt.Frame{Src: src, Dst: dst, TCP: &testpkt.TCP{SrcPort: sport, DstPort: dport, Seq: 1, Ack: 1, Flags: flags,
		Options: opts, Payload: payload}}.Bytes()
}

var (
	udp       = testpkt.Frame{Src: clientPod, Dst: serverPod, Protocol: 17, Payload: make([]byte, 64)}.Bytes()
	plainTCP  = frame(clientPod, serverPod, 33000, 80, testpkt.ACK, testpkt.Join(testpkt.NOP(), testpkt.NOP(), testpkt.Timestamps(1, 2)), make([]byte, 1000))
	capSYN    = frame(clientPod, serverPod, 40000, 5201, testpkt.SYN, testpkt.MPCapableSYN(), nil)
	capACK    = frame(clientPod, serverPod, 40000, 5201, testpkt.ACK, testpkt.MPCapableACK(clientKey, serverKey), nil)
	dssData   = frame(clientPod, serverPod, 40000, 5201, testpkt.ACK|testpkt.PSH, dssOption(), make([]byte, 1000))
	joinSYN   = frame(clientPod, serverPod, 40001, 5201, testpkt.SYN, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false), nil)
	joinLocal = netip.AddrPortFrom(clientPod, 40001)
	joinPeer  = netip.AddrPortFrom(serverPod, 5201)
	// chainSYN opens a connection that only the last rule of the chain
	// selects; chainDSS is data of the connection it opens.
	chainSYN = frame(clientPod, serverPod, 40100, 5201, testpkt.SYN, testpkt.MPCapableSYN(), nil)
	chainACK = frame(clientPod, serverPod, 40100, 5201, testpkt.ACK, testpkt.MPCapableACK(clientKey+1, serverKey+1), nil)
	chainDSS = frame(clientPod, serverPod, 40100, 5201, testpkt.ACK|testpkt.PSH, dssOption(), make([]byte, 1000))
	// chainDSSIn is the peer's data on the same subflow, into the pod.
	chainDSSIn = frame(serverPod, clientPod, 5201, 40100, testpkt.ACK|testpkt.PSH, dssOption(), make([]byte, 1000))
	chainLocal = netip.AddrPortFrom(clientPod, 40100)
)

// chainRules is the selector chain of the chain cases: three rules that
// leave the SYN (wrong family, ports, CIDR: each one checked in turn), then
// a weighted rule that selects it by CIDR and port.
var chainRules = []datapath.Rule{
	{Paths: []uint32{5}, Family: datapath.FamilyIPv6},
	{Paths: []uint32{5}, Ports: []datapath.PortRange{{First: 1, Last: 1024}, {First: 8000, Last: 9000}}},
	{Paths: []uint32{5}, CIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("172.16.0.0/12")}},
	{Paths: []uint32{1, 2, 3, 4}, Weights: []uint32{4, 3, 2, 1}, Spread: datapath.SpreadWeighted,
		CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Ports: []datapath.PortRange{{First: 5000, Last: 5999}},
		Backup: []uint32{6}, RewriteHeaders: true},
}

// fullChainActors configure, for the full-chain cases, the actors of the
// rule the chain selects (rule id chainRuleBase+len(chainRules)-1): the
// selector chain, spread and backup paths are chainRules', the record
// actor's pod counters exist with every endpoint, and police caps each
// connection at 40 Gbit/s with a 1 GiB bucket: every data packet is charged
// to its bucket and none is dropped (the check says so; a run's million
// packets are about 1 GB and the bucket starts full), and the bucket is
// 215 ms deep at its rate, so police reads the coarse clock as it does for
// a rule with the default depth (200 ms).
var fullChainActors = []func(b *testing.B, dp *datapath.Datapath, rule uint32){
	func(b *testing.B, dp *datapath.Datapath, rule uint32) {
		c := datapath.RateConfig{Mode: datapath.RatePolice, PerConnection: 40e9, Directions: datapath.Egress | datapath.Ingress, BurstBytes: 1 << 30}
		if err := dp.SetRateRule(rule, datapath.OwnBudget(rule), c); err != nil {
			b.Fatal(err)
		}
	},
}

const chainRuleBase = 10

// setupChain installs chainRules as the client pod's selector chain and
// runs fullChainActors on the rule that selects the chain's SYN.
func setupChain(b *testing.B, dp *datapath.Datapath) {
	b.Helper()
	ids := make([]uint32, len(chainRules))
	for i, r := range chainRules {
		ids[i] = chainRuleBase + uint32(i)
		if err := dp.SetRule(ids[i], r); err != nil {
			b.Fatal(err)
		}
	}
	if err := dp.SetEndpointRules(clientPod, ids...); err != nil {
		b.Fatal(err)
	}
	for _, configure := range fullChainActors {
		configure(b, dp, ids[len(ids)-1])
	}
}

// chainPlaced checks that the chain's subflow was placed by its last rule.
func chainPlaced(dp *datapath.Datapath) error {
	sfs, err := dp.Subflows()
	if err != nil {
		return err
	}
	for _, sf := range sfs {
		if sf.Local == chainLocal {
			if want := chainRuleBase + uint32(len(chainRules)) - 1; sf.Rule != want {
				return fmt.Errorf("chain subflow placed by rule %d, want %d", sf.Rule, want)
			}
			return nil
		}
	}
	return fmt.Errorf("chain subflow not placed")
}

// dssOption is what a data segment of an established connection carries: a
// timestamp, and a DSS with a 64-bit Data ACK and a 64-bit mapping.
func dssOption() []byte {
	ack := uint64(1 << 33)
	return testpkt.Join(testpkt.NOP(), testpkt.NOP(), testpkt.Timestamps(1, 2), testpkt.DSS{DataACK: &ack, DataACK8: true,
		Mapping: &testpkt.DSSMapping{DSN: 1 << 34, DSN8: true, SSN: 1, Length: 1000}}.Bytes())
}

// setup loads the datapath with one rule over four paths selecting the
// client pod, places the connection's initial subflow and learns its tokens.
func setup(b *testing.B) *datapath.Datapath {
	b.Helper()
	testutil.RequireRoot(b)
	dp, err := datapath.Load(datapath.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dp.Close() })
	if err := dp.SetRule(0, datapath.Rule{Paths: []uint32{1, 2, 3, 4}}); err != nil {
		b.Fatal(err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		b.Fatal(err)
	}
	// The node has peers, as one with liveness probes has: pod_egress
	// notes what the pod sends to the server's node (a lookup per tick
	// of the coarse clock, a per-CPU note per packet).
	if err := dp.SetPeerSlots(map[netip.Prefix]uint32{netip.PrefixFrom(serverPod, 24).Masked(): 1}); err != nil {
		b.Fatal(err)
	}
	prog := dp.Program(datapath.HookPodEgress)
	for _, f := range [][]byte{capSYN, capACK} {
		if _, err := prog.Run(&ebpf.RunOptions{Data: f}); err != nil {
			b.Fatal(err)
		}
	}
	return dp
}

// repeated measures prog on f with the kernel repeating it; every run takes
// the same path, so the kernel's average is the cost of one packet.
func repeated(b *testing.B, prog *ebpf.Program, f []byte) float64 {
	b.Helper()
	_, per, err := prog.Benchmark(f, repeat, nil)
	if err != nil {
		b.Fatal(err)
	}
	return float64(per.Nanoseconds())
}

// single measures prog on f one run per syscall, calling reset before each
// run, and returns the mean of the kernel's per-run times.
func single(b *testing.B, prog *ebpf.Program, f []byte, reset func() error) float64 {
	b.Helper()
	var total time.Duration
	for range placements {
		if reset != nil {
			if err := reset(); err != nil {
				b.Fatal(err)
			}
		}
		_, d, err := prog.Benchmark(f, 1, nil)
		if err != nil {
			b.Fatal(err)
		}
		total += d
	}
	return float64(total.Nanoseconds()) / placements
}

// benchCase is one measured packet.
type benchCase struct {
	name string
	// label names the case in the report's table where name is too long
	// for a row of the docs' width.
	label   string
	measure func(b *testing.B, dp *datapath.Datapath, empty *ebpf.Program) float64
	// check says whether the last run took the intended path.
	check func(dp *datapath.Datapath) error
}

// row is the case as the report's table names it.
func (c benchCase) row() string {
	if c.label != "" {
		return c.label
	}
	return c.name
}

var cases = []benchCase{
	{name: "empty program", measure: func(b *testing.B, _ *datapath.Datapath, empty *ebpf.Program) float64 {
		return repeated(b, empty, plainTCP)
	}},
	{name: "non-TCP (UDP)", measure: func(b *testing.B, dp *datapath.Datapath, _ *ebpf.Program) float64 {
		return repeated(b, dp.Program(datapath.HookPodEgress), udp)
	}},
	{name: "plain TCP", measure: func(b *testing.B, dp *datapath.Datapath, _ *ebpf.Program) float64 {
		return repeated(b, dp.Program(datapath.HookPodEgress), plainTCP)
	}},
	{name: "MPTCP data (DSS) of a placed subflow", measure: func(b *testing.B, dp *datapath.Datapath, _ *ebpf.Program) float64 {
		return repeated(b, dp.Program(datapath.HookPodEgress), dssData)
	}, check: func(dp *datapath.Datapath) error {
		st, err := dp.Stats()
		if err != nil {
			return err
		}
		if st[datapath.StatMarked] < repeat {
			return fmt.Errorf("%d packets marked, want every DSS packet of the placed subflow", st[datapath.StatMarked])
		}
		return nil
	}},
	{name: "MPTCP data (DSS) of a placed subflow, observe-only", measure: func(b *testing.B, dp *datapath.Datapath, _ *ebpf.Program) float64 {
		if err := dp.SetObserveOnly(true); err != nil {
			b.Fatal(err)
		}
		return repeated(b, dp.Program(datapath.HookPodEgress), dssData)
	}, check: func(dp *datapath.Datapath) error {
		st, err := dp.Stats()
		if err != nil {
			return err
		}
		// setup's SYN and ACK were marked, before the switch.
		if st[datapath.StatObserved] < repeat || st[datapath.StatMarked] != 2 {
			return fmt.Errorf("%d packets observed, %d marked; want every DSS packet observed and only setup's 2 marked", st[datapath.StatObserved], st[datapath.StatMarked])
		}
		return nil
	}},
	{name: "empty program, one run per syscall", measure: func(b *testing.B, _ *datapath.Datapath, empty *ebpf.Program) float64 {
		return single(b, empty, joinSYN, nil)
	}},
	{name: "MP_JOIN SYN placement, one run per syscall", measure: func(b *testing.B, dp *datapath.Datapath, _ *ebpf.Program) float64 {
		prog := dp.Program(datapath.HookPodEgress)
		// Each placement inserts the join's subflow and claims a path of
		// the connection: undo both, and learn the connection again
		// (unmeasured), so every measured run places a join with a known
		// token on a free path.
		return single(b, prog, joinSYN, func() error {
			if err := dp.ForgetSubflow(joinLocal, joinPeer); err != nil {
				return err
			}
			if err := dp.ForgetConnection(clientPod, tokenOf(serverKey), tokenOf(clientKey)); err != nil {
				return err
			}
			_, err := prog.Run(&ebpf.RunOptions{Data: capACK})
			return err
		})
	}, check: func(dp *datapath.Datapath) error {
		st, err := dp.Stats()
		if err != nil {
			return err
		}
		if st[datapath.StatJoinTokenUnknown] != 0 || st[datapath.StatPathsExhausted] != 0 || st[datapath.StatJoinTokenKnown] < placements {
			return fmt.Errorf("joins: known token %d, unknown %d, sharing a path %d: not the placement path measured",
				st[datapath.StatJoinTokenKnown], st[datapath.StatJoinTokenUnknown], st[datapath.StatPathsExhausted])
		}
		return nil
	}},
	{name: "MP_CAPABLE SYN through a 4-rule selector chain, weighted spread, one run per syscall", label: "MP_CAPABLE SYN, 4-rule chain, weighted, one run per syscall", measure: func(b *testing.B, dp *datapath.Datapath, _ *ebpf.Program) float64 {
		setupChain(b, dp)
		// Each run inserts the subflow: forget it (unmeasured) so every
		// measured run selects and places anew.
		return single(b, dp.Program(datapath.HookPodEgress), chainSYN, func() error {
			return dp.ForgetSubflow(chainLocal, joinPeer)
		})
	}, check: func(dp *datapath.Datapath) error {
		st, err := dp.Stats()
		if err != nil {
			return err
		}
		if st[datapath.StatNoRuleMatch] != 0 || st[datapath.StatSubflowPlaced] < placements {
			return fmt.Errorf("chain SYNs: %d placed, %d selected by no rule", st[datapath.StatSubflowPlaced], st[datapath.StatNoRuleMatch])
		}
		return chainPlaced(dp)
	}},
	{name: "full chain: MPTCP data (DSS) of a subflow the chain placed (spread + police + backup + record)", label: "full chain out: DSS of a placed subflow (spread, police, backup, record)", measure: func(b *testing.B, dp *datapath.Datapath, _ *ebpf.Program) float64 {
		return repeated(b, openChainConnection(b, dp), chainDSS)
	}, check: func(dp *datapath.Datapath) error {
		return chainCounted(dp, func(p datapath.TrafficCounters) uint64 { return p.TxPackets })
	}},
	{name: "full chain into the pod: MPTCP data (DSS) on the same subflow (police + backup + block + record)", label: "full chain in: DSS on the same subflow (police, backup, block, record)", measure: func(b *testing.B, dp *datapath.Datapath, _ *ebpf.Program) float64 {
		openChainConnection(b, dp)
		return repeated(b, dp.Program(datapath.HookPodIngress), chainDSSIn)
	}, check: func(dp *datapath.Datapath) error {
		return chainCounted(dp, func(p datapath.TrafficCounters) uint64 { return p.RxPackets })
	}},
	{name: "nic_egress: UDP the node sends itself", measure: func(b *testing.B, dp *datapath.Datapath, _ *ebpf.Program) float64 {
		return repeatedFrom(b, nicWithPodCap(b, dp), udp, 0)
	}, check: podCapCharged(false)},
	{name: "nic_egress: UDP forwarded from no selected pod", measure: func(b *testing.B, dp *datapath.Datapath, _ *ebpf.Program) float64 {
		return repeatedFrom(b, nicWithPodCap(b, dp), udp, podInterface+1)
	}, check: podCapCharged(false)},
	{name: "nic_egress: a selected pod's UDP under its per-pod police cap", measure: func(b *testing.B, dp *datapath.Datapath, _ *ebpf.Program) float64 {
		return repeatedFrom(b, nicWithPodCap(b, dp), udp, podInterface)
	}, check: podCapCharged(true)},
	{name: "nic_egress: a selected pod's plain TCP data under its per-pod police cap", measure: func(b *testing.B, dp *datapath.Datapath, _ *ebpf.Program) float64 {
		return repeatedFrom(b, nicWithPodCap(b, dp), plainTCP, podInterface)
	}, check: podCapCharged(true)},
}

// loopback is the test run's device, the path's NIC in the nic_egress
// cases; podInterface the client pod's host-side interface there.
const loopback, podInterface = 1, 4242

// repeatedFrom is repeated for a packet that entered the node by interface
// ingress (0: sent by the node itself). The kernel does not report its
// time with a context given, so the run is timed from here: one syscall's
// cost spread over the repetitions.
func repeatedFrom(b *testing.B, prog *ebpf.Program, f []byte, ingress uint32) float64 {
	b.Helper()
	opts := &ebpf.RunOptions{Data: f, Repeat: repeat, Context: skbContext{IngressIfindex: ingress}}
	start := time.Now()
	if _, err := prog.Run(opts); err != nil {
		b.Fatal(err)
	}
	return float64(time.Since(start).Nanoseconds()) / repeat
}

// skbContext is the head of struct __sk_buff the runs set (the rest zero).
type skbContext struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex                                           uint32
	_                                                                           [192 - 11*4]byte
}

// nicWithPodCap gives the client pod's rule a per-pod egress police cap no
// packet reaches, makes loopback the NIC of path 1 and podInterface the
// client pod's interface, and returns nic_egress.
func nicWithPodCap(b *testing.B, dp *datapath.Datapath) *ebpf.Program {
	b.Helper()
	c := datapath.RateConfig{Mode: datapath.RatePolice, PerPod: 1e12, Directions: datapath.Egress}
	if err := dp.SetRateRule(0, datapath.OwnBudget(0), c); err != nil {
		b.Fatal(err)
	}
	if err := dp.SetNIC(loopback, 1); err != nil {
		b.Fatal(err)
	}
	if err := dp.SyncPodInterfaces([]datapath.PodInterface{{Ifindex: podInterface, Addr: clientPod}}); err != nil {
		b.Fatal(err)
	}
	return dp.Program(datapath.HookNICEgress)
}

// podCapCharged checks the last case's path: the pod's police bucket exists
// when want (the packets were charged to it), none otherwise, and nothing
// was dropped by a cap no packet reaches.
func podCapCharged(want bool) func(dp *datapath.Datapath) error {
	return func(dp *datapath.Datapath) error {
		st, err := dp.Stats()
		if err != nil {
			return err
		}
		if st[datapath.StatRateDropPod] != 0 {
			return fmt.Errorf("%d packets dropped by a cap no packet reaches", st[datapath.StatRateDropPod])
		}
		n, err := dp.Occupancy()
		if err != nil {
			return err
		}
		if got := n["police_buckets"].Entries; (got > 0) != want {
			return fmt.Errorf("police buckets in use: %d; want some: %v", got, want)
		}
		return nil
	}
}

// openChainConnection sets up the selector chain and runs its connection's
// SYN and third ACK through pod_egress: the subflow is placed and the
// connection known, as for every data packet after the handshake. It
// returns pod_egress.
func openChainConnection(b *testing.B, dp *datapath.Datapath) *ebpf.Program {
	b.Helper()
	setupChain(b, dp)
	prog := dp.Program(datapath.HookPodEgress)
	for _, f := range [][]byte{chainSYN, chainACK} {
		if _, err := prog.Run(&ebpf.RunOptions{Data: f}); err != nil {
			b.Fatal(err)
		}
	}
	return prog
}

// chainCounted checks a full-chain case took the path it claims: the chain
// placed the subflow, the connection was learnt, the record actor counted
// every packet (packets reads the direction's pod counter) and police
// dropped none.
func chainCounted(dp *datapath.Datapath, packets func(datapath.TrafficCounters) uint64) error {
	if err := chainPlaced(dp); err != nil {
		return err
	}
	conns, err := dp.Connections()
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(conns, func(c datapath.Connection) bool { return c.Token == tokenOf(serverKey+1) }) {
		return fmt.Errorf("the chain's connection was not learnt: %+v", conns)
	}
	pods, err := dp.PodStats()
	if err != nil {
		return err
	}
	if packets(pods[clientPod]) < repeat {
		return fmt.Errorf("pod counters %+v: the record actor did not count every packet", pods[clientPod])
	}
	st, err := dp.Stats()
	if err != nil {
		return err
	}
	if st[datapath.StatRateDropConn] != 0 {
		return fmt.Errorf("police dropped %d packets: the case measured drops, not the chain", st[datapath.StatRateDropConn])
	}
	return nil
}

// BenchmarkPodEgress reports ns/pkt for each case; the runs of one process
// are collected for the report.
func BenchmarkPodEgress(b *testing.B) {
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			dp := setup(b)
			empty := emptyProgram(b)
			var sum float64
			var n int
			for b.Loop() {
				ns := c.measure(b, dp, empty)
				record(c.name, ns)
				sum += ns
				n++
			}
			if c.check != nil {
				if err := c.check(dp); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(sum/float64(n), "ns/pkt")
		})
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if path := os.Getenv("BENCH_REPORT"); path != "" && code == 0 && len(results.ns) > 0 {
		if err := writeReport(path); err != nil {
			fmt.Fprintln(os.Stderr, "writing the report:", err)
			code = 1
		}
	}
	os.Exit(code)
}
