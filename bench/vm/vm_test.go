// Package vm measures what the host gives a VM guest's MPTCP connection to
// another VM on another node: goodput with kernel routing (every subflow
// on the node's default NIC), with hand-written host routing, and with the
// agent, with the other NIC idle or loaded by another tenant. With
// BENCH_REPORT=<file> the results rewrite their section of that file
// (docs/benchmarks.md).
//
//	BENCH_REPORT=$PWD/docs/benchmarks.md go test -run '^$' -bench . -benchtime 5x ./bench/vm/
package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/guest"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

const (
	section = "## VM to VM"
	// transfer is each connection's length; goodput is measured over
	// window after warmup.
	transfer = 10 * time.Second
	warmup   = 2 * time.Second
	window   = 6 * time.Second
	// signalPort is the port the server VM announces for its second path.
	signalPort = 6002
)

var bins framework.Binaries

func TestMain(m *testing.M) { os.Exit(framework.RunWithBinaries(m, &bins)) }

// Who places the VMs' subflows.
const (
	kernelRouting = "kernel routing"
	handRouting   = "hand-written host routing"
	agentRouting  = "mptcp-operator agent"
)

var routings = []string{kernelRouting, handRouting, agentRouting}

// cell is one measurement of a round.
type cell struct {
	rate       string
	routing    string
	background bool
}

func (c cell) String() string {
	bg := "idle"
	if c.background {
		bg = "nic1 loaded"
	}
	return fmt.Sprintf("%s, %s, %s", c.rate, c.routing, bg)
}

var cells = func() []cell {
	var out []cell
	for _, rate := range []string{"50mbit", "200mbit"} {
		for _, bg := range []bool{false, true} {
			for _, r := range routings {
				out = append(out, cell{rate: rate, routing: r, background: bg})
			}
		}
	}
	return out
}()

// vmBed is a bed with a VM in pod (1,1) (the client) and one in pod (2,1)
// (the server), bridge binding, configured as their tenants would: the
// server announces a second port, the client accepts announcements.
type vmBed struct {
	bed            *testbed.Bed
	client, server *testbed.Guest
}

func newVMBed(b *testing.B, rate string) *vmBed {
	b.Helper()
	bed := testbed.NewForTest(b, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: rate})
	dir := filepath.Join(b.TempDir(), "guest")
	vb := &vmBed{bed: bed,
		client: bed.BootGuestForTest(b, bed.Pod(1, 1), testbed.BridgeBinding, dir),
		server: bed.BootGuestForTest(b, bed.Pod(2, 1), testbed.BridgeBinding, dir)}
	ctx := b.Context()
	testbed.Must(b, vb.server.ConfigureMPTCP(ctx, guest.MPTCPConfig{Subflows: 2, Endpoints: []guest.Endpoint{
		{Addr: vb.server.Addr, Port: signalPort, Flags: []string{"signal"}}}}))
	testbed.Must(b, vb.client.ConfigureMPTCP(ctx, guest.MPTCPConfig{Subflows: 2, AddAddrAccepted: 2}))
	return vb
}

// measurement is one cell's transfer.
type measurement struct {
	goodput float64 // bit/s, at the server VM
	// clientCPU and serverCPU are the VMs' busy share of their vCPU over
	// the transfer.
	clientCPU, serverCPU float64
}

// run measures c on vb: the routing set up, the background started, one
// connection from the client VM to the server VM, and all of it undone.
func (vb *vmBed) run(b *testing.B, c cell, port int) measurement {
	b.Helper()
	ctx := b.Context()
	bed := vb.bed
	switch c.routing {
	case handRouting:
		testbed.Must(b, bed.HandRoute([]int{signalPort}))
		defer func() { testbed.Must(b, bed.RemoveHandRoute()) }()
	case agentRouting:
		guestMode := func(*testbed.Node) mptcpv1alpha1.CompiledRule {
			return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationGuest}
		}
		agents, err := framework.StartAgentsWith(ctx, bed, bins.Agent, guestMode)
		if err != nil {
			b.Fatal(err)
		}
		defer func() {
			for _, a := range agents {
				if m, err := a.Scrape(); err == nil {
					downs, _ := m.Value("mptcp_agent_path_down_transitions_total", "path", framework.PathName(1))
					stats, _ := a.DatapathStats()
					b.Logf("%v: node %d: path 1 down %v times; datapath %v", c, a.Node.Index, downs, stats)
				}
				testbed.Must(b, a.Uninstall(context.Background()))
			}
		}()
	}
	if c.background {
		stop := vb.loadNIC1(b, port+1000)
		defer stop()
	}
	sink, err := vb.server.Start(ctx, "/bin/traffic", "sink", "-listen", netip.AddrPortFrom(vb.server.Addr, uint16(port)).String(),
		"-mptcp", "-warmup", warmup.String(), "-window", window.String())
	if err != nil {
		b.Fatal(err)
	}
	testbed.Must(b, vb.server.WaitListening(ctx, port))
	cpu0 := [2]cpuTimes{readCPU(b, vb.client), readCPU(b, vb.server)}
	if _, err := vb.client.Run(ctx, "/bin/traffic", "blast", "-to", netip.AddrPortFrom(vb.server.Addr, uint16(port)).String(),
		"-mptcp", "-duration", transfer.String()); err != nil {
		b.Fatalf("%v: %v", c, err)
	}
	cpu1 := [2]cpuTimes{readCPU(b, vb.client), readCPU(b, vb.server)}
	resp, err := sink.Wait(ctx)
	if err != nil || resp.Exit != 0 {
		b.Fatalf("%v: sink: %v, exit %d: %s", c, err, resp.Exit, resp.Stderr)
	}
	var rep struct {
		MPTCP      bool    `json:"mptcp"`
		GoodputBps float64 `json:"goodput_bps"`
		Changed    int64   `json:"changed"`
		Error      string  `json:"error"`
	}
	if err := json.Unmarshal([]byte(resp.Stdout), &rep); err != nil {
		b.Fatalf("%v: sink report %q: %v", c, resp.Stdout, err)
	}
	if rep.Changed >= 0 || rep.Error != "" || !rep.MPTCP {
		b.Fatalf("%v: the stream arrived changed at offset %d, or not over MPTCP (%v), or broken: %s", c, rep.Changed, rep.MPTCP, rep.Error)
	}
	return measurement{goodput: rep.GoodputBps, clientCPU: cpu1[0].busySince(cpu0[0]), serverCPU: cpu1[1].busySince(cpu0[1])}
}

// loadNIC1 starts another tenant's bulk TCP transfer over the nodes' nic1
// (node 1 to node 2's nic1 address, routed by nobody but the kernel) for
// longer than the measured connection, and returns what stops it.
func (vb *vmBed) loadNIC1(b *testing.B, port int) (stop func()) {
	b.Helper()
	bed := vb.bed
	to := netip.AddrPortFrom(bed.Node(2).NICs[0].Addr.Addr(), uint16(port))
	srv, err := bed.Start(bed.Node(2).NetNS, bins.Traffic, "sink", "-listen", to.String())
	if err != nil {
		b.Fatal(err)
	}
	testbed.Must(b, srv.WaitOutput(b.Context(), "listening on"))
	snd, err := bed.Start(bed.Node(1).NetNS, bins.Traffic, "blast", "-to", to.String(), "-duration", (transfer + 10*time.Second).String())
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Second) // the background at its rate before the VMs start
	return func() {
		_ = snd.Stop(time.Second)
		_ = srv.Stop(time.Second)
	}
}

// cpuTimes are a guest's CPU times (/proc/stat, in ticks).
type cpuTimes struct{ busy, total float64 }

func readCPU(b *testing.B, g *testbed.Guest) cpuTimes {
	b.Helper()
	stat, err := g.ReadFile(b.Context(), "/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	fields := strings.Fields(strings.SplitN(stat, "\n", 2)[0])[1:]
	var t cpuTimes
	for i, f := range fields {
		v, _ := strconv.ParseFloat(f, 64)
		t.total += v
		if i != 3 && i != 4 { // idle, iowait
			t.busy += v
		}
	}
	return t
}

func (t cpuTimes) busySince(before cpuTimes) float64 {
	if t.total <= before.total {
		return 0
	}
	return (t.busy - before.busy) / (t.total - before.total)
}

// BenchmarkVMToVM runs, b.N rounds over, every cell: a bed per link rate
// with its two VMs, the cells of a rate one after another in each round.
func BenchmarkVMToVM(b *testing.B) {
	beds := map[string]*vmBed{}
	results := make([][]measurement, len(cells))
	port := 7000
	for b.Loop() {
		for i, c := range cells {
			vb := beds[c.rate]
			if vb == nil {
				vb = newVMBed(b, c.rate)
				beds[c.rate] = vb
			}
			port++
			m := vb.run(b, c, port)
			results[i] = append(results[i], m)
			b.Logf("%v: goodput %.1f Mbit/s, VM CPU busy: client %.0f%%, server %.0f%%", c, m.goodput/1e6, 100*m.clientCPU, 100*m.serverCPU)
		}
	}
	if path := os.Getenv("BENCH_REPORT"); path != "" {
		var accel guest.Accel
		for _, vb := range beds {
			accel = vb.client.Accel
		}
		if err := benchdoc.ReplaceSection(path, section, report(results, accel)); err != nil {
			b.Fatal(err)
		}
	}
}

func report(results [][]measurement, accel guest.Accel) string {
	var s strings.Builder
	rounds := len(results[0])
	fmt.Fprintf(&s, "%s\n\n", section)
	fmt.Fprintf(&s, "`BENCH_REPORT=$PWD/docs/benchmarks.md go test -run '^$' -bench BenchmarkVMToVM -benchtime %dx ./bench/vm/`, on %s: %s, %d CPUs, Linux %s. ",
		rounds, time.Now().UTC().Format("2006-01-02"), benchdoc.CPUModel(), runtime.NumCPU(), benchdoc.KernelRelease())
	fmt.Fprintf(&s, "Two nodes, two links of the rate named; a VM (QEMU, %s, one vCPU, Debian's 6.1 cloud kernel, bridge binding) in a pod of each "+
		"node, configured as its tenant would: the server announces a second port, the client accepts two announcements. One MPTCP "+
		"connection of %v from the client VM to the server VM (`traffic blast` and `sink`: a repeated block, every byte compared); goodput "+
		"at the server over %v after %v. Kernel routing: nothing steers, every subflow leaves on nic1; hand-written host routing: the "+
		"nodes route the announced port over nic2; the agent: guest mode on both nodes. \"nic1 loaded\": another tenant's bulk TCP "+
		"transfer from node 1 to node 2 over nic1 for the whole measurement. The cells of a round run one after another, rounds "+
		"interleaved. Goodput is min/median/max; /kernel and /hand divide its median by kernel routing's and hand-written "+
		"routing's. VM CPU: the share of the client's and the server's vCPU busy over the transfer, medians.\n\n",
		accel, transfer, window, warmup)
	s.WriteString("| links | nic1 | placed by | rounds | goodput (Mbit/s) | /kernel | /hand | VM CPU client/server |\n" +
		"|---|---|---|---|---|---|---|---|\n")
	byCell := map[cell][]measurement{}
	for i, c := range cells {
		byCell[c] = results[i]
	}
	goodputs := func(ms []measurement) []float64 {
		var g []float64
		for _, m := range ms {
			g = append(g, m.goodput)
		}
		return g
	}
	for i, c := range cells {
		g := goodputs(results[i])
		lo, hi := slices.Min(g), slices.Max(g)
		med := testutil.Median(g)
		kernel := testutil.Median(goodputs(byCell[cell{rate: c.rate, routing: kernelRouting, background: c.background}]))
		hand := testutil.Median(goodputs(byCell[cell{rate: c.rate, routing: handRouting, background: c.background}]))
		var cc, sc []float64
		for _, m := range results[i] {
			cc, sc = append(cc, m.clientCPU), append(sc, m.serverCPU)
		}
		fmt.Fprintf(&s, "| 2 x %s | %s | %s | %d | %.1f/%.1f/%.1f | %.2f | %.2f | %.0f %%/%.0f %% |\n",
			c.rate, map[bool]string{false: "idle", true: "loaded"}[c.background], c.routing, len(g), lo/1e6, med/1e6, hi/1e6,
			med/kernel, med/hand, 100*testutil.Median(cc), 100*testutil.Median(sc))
	}
	return s.String()
}
