package xdpdrop

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/internal/limits"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

const section = "## XDP or TC for dropping a flood"

// loadAverage is the machine's 1-minute load average, as /proc/loadavg
// gives it.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(b))[0]
}

// wireBits is what one flood frame of frameLen bytes takes on an Ethernet
// wire: the frame, its FCS, preamble and inter-frame gap.
func wireBits(frameLen int) float64 { return float64(frameLen+4+8+12) * 8 }

// writeReport replaces (or appends) the section of the report, leaving the
// rest of the file to its other authors.
func writeReport(path string, results map[string][]float64, load1 string, frameLen int) error {
	med := map[string]float64{}
	for _, c := range cases {
		_, med[c.key] = testutil.MinMedian(results[c.key])
	}
	node := func(key string) float64 { return med[key] - med["sender"] }
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", section)
	fmt.Fprintf(&b, "`make bench-xdpdrop`, i.e. `BENCH_REPORT=$PWD/docs/benchmarks.md go test -count=1 -run '^$' -bench . -benchtime=1x "+
		"./bench/xdpdrop/`, on %s: %s, %d CPUs, Linux %s, %s; load average (1 min) when the run began: %s.\n\n",
		time.Now().UTC().Format("2006-01-02"), benchdoc.CPUModel(), runtime.NumCPU(), benchdoc.KernelRelease(), runtime.Version(), load1)
	fmt.Fprintf(&b, "What it measures: the CPU a node spends per packet of a flood of join SYNs (TCP SYN carrying MP_JOIN, "+
		"RFC 8684 3.2, as Linux sends one: MSS, SACK permitted, timestamps, window scale, then MP_JOIN; %d-byte frames) "+
		"to a pod address, arriving on its path NIC, when nothing drops the flood, when a TC program drops it, when an XDP "+
		"program does, and when the datapath's own `nic_ingress` meets it, as it does today.\n\n", frameLen)
	fmt.Fprintf(&b, "How:\n\n"+
		"- Two network namespaces joined by a veth: the peer and the node. The node forwards, as a node does for its pods, "+
		"and routes the pods' network to a blackhole: a flood packet no program drops goes up the stack, through GRO and IP, "+
		"and is dropped at its route lookup, unanswered: a cheap end for it, where a local address with no listener "+
		"would cost more (a reset built and sent per SYN). GRO is on at the node's end, as on a NIC; on a "+
		"veth it is also what gives the receiving end the NAPI context that takes XDP frames.\n"+
		"- The peer floods with BPF_PROG_TEST_RUN in live-frame mode: the kernel runs an XDP program (`flood`, drop.c) on "+
		"frames built from one template, %d per syscall; it gives each frame the next of %d source ports (so the flood is "+
		"as many 4-tuples, as a forged one would be), keeps the checksum right and returns XDP_TX, which hands the frame "+
		"to the veth's other end. The node's veth receives it as an XDP frame, as a NIC driver receives a buffer: a "+
		"native XDP program sees it before any skb exists, and without one the veth builds the skb, hands it to GRO and "+
		"up the stack. (An AF_PACKET sender would hand the node the sender's own skb: nothing would be left for the "+
		"node's XDP to save.)\n"+
		"- The cases: nothing on the node's veth; `tc_drop` on its TCX ingress; `xdp_drop` as a native XDP program, "+
		"and the same program in generic (skb) mode; the datapath's `nic_ingress` configured as the agent does for a "+
		"node whose path is this veth and whose selected pod the flood targets (it stages each join SYN in the pod's own "+
		"map of waiting SYNs in `arrivals`, an LRU map of %d entries that this flood's %d 4-tuples keep evicting, and "+
		"passes it to the stack); and the "+
		"sender alone, the same flood dropped by the peer's own program before the veth. `tc_drop` and `xdp_drop` are "+
		"the same minimal parse (Ethernet, IPv4, TCP, the option list) written for this benchmark: what differs is the "+
		"hook.\n"+
		"- CPU: the sending thread is pinned to one CPU, and the node's receive runs on it too: the veth's NAPI poll "+
		"is a softirq raised on that CPU, run on the syscall's way out of each batch of 64 frames. This kernel has no "+
		"IRQ_TIME_ACCOUNTING, so the thread's run time (its schedstat, to the nanosecond) includes those softirqs; "+
		"what the CPU's ksoftirqd ran meanwhile is added. ns/pkt is that time over the packets sent. Each run is "+
		"%d packets after %d unmeasured; in each, the case's own count (the drop programs' counters, `Ip: InReceives` "+
		"of the node for the stack, the datapath's `arrival_staged` for `nic_ingress`) must move by exactly the "+
		"packets sent. %d rounds, each running every case once, in an order rotated each round.\n"+
		"- The node's share is a case's median less the sender alone's: what every row carries of the sender "+
		"(building, the flood program, the test run's loop), and the ratio divides medians by the stack's, sender "+
		"included.\n\n",
		*packets, *ports, limits.PodArrivals, *ports, *packets, warmup, len(results["stack"]))
	b.WriteString("| case | runs | min ns/pkt | median ns/pkt | median / no program | the node's share (median − sender alone) |\n" +
		"|---|---|---|---|---|---|\n")
	for _, c := range cases {
		v := results[c.key]
		if len(v) == 0 {
			continue
		}
		lo, m := testutil.MinMedian(v)
		share := fmt.Sprintf("%.0f", node(c.key))
		if c.key == "sender" {
			share = "—"
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.1f | %.2f | %s |\n", c.name, len(v), lo, m, m/med["stack"], share)
	}
	fmt.Fprintf(&b, "\nLimits: a veth is not a physical NIC. Before any program runs, a NIC's driver pays for DMA, its "+
		"descriptor rings, interrupts and cache misses on data the device just wrote; here the frames come from pages "+
		"the sender's CPU just touched, over a ring in memory. Those costs are the same in every case, so on a NIC every "+
		"row grows by them: the ratios shrink, the differences between rows stay. The veth builds its skbs in bulk from "+
		"a per-CPU cache; a driver that allocates one skb per packet would make what XDP saves larger. One CPU "+
		"does everything here, and the machine is shared: interrupts of other work that land on the thread's CPU while "+
		"it runs are charged to it, which the min shows least.\n\n")
	b.WriteString(meaning(node, frameLen))
	return benchdoc.ReplaceSection(path, section, b.String())
}

// cores is the node's CPUs: this machine's, and the size the project's
// machines have.
const cores = 2

// meaning is the paragraph on what the figures mean for the datapath; node
// gives a case's share of the node's CPU, in ns per packet.
func meaning(node func(key string) float64, frameLen int) string {
	var b strings.Builder
	stack, tc, xdp, generic, nic := node("stack"), node("tc"), node("xdp"), node("xdp-generic"), node("nic_ingress")
	saving := tc - xdp
	fmt.Fprintf(&b, "What it means for the datapath: native XDP drops a flood packet for %.0f ns of the node's CPU, TC for %.0f: "+
		"%.0f ns %s (%.0f %%). TC comes late: %.0f %% of what the stack spends on such a packet with no program (%.0f) "+
		"is spent by the time TC has dropped it, the skb and GRO included; generic XDP, which runs on the skb, costs %.0f. ",
		xdp, tc, math.Abs(saving), lessOrMore(saving), 100*math.Abs(saving)/tc, 100*tc/stack, stack, generic)
	fmt.Fprintf(&b, "Per core that is %s dropped in TC and %s in XDP (%d-byte frames: %s and %s on the wire), twice that on "+
		"the node's %d cores when RSS spreads the flood over a queue per core (this veth has one). ",
		mpps(1e9/tc), mpps(1e9/xdp), frameLen, gbits(1e9/tc, frameLen), gbits(1e9/xdp, frameLen), cores)
	if saving > 0 {
		fmt.Fprintf(&b, "XDP's saving over TC is %.1f %% of one core at 100 kpps, a tenth of the node's %d cores at %s, a "+
			"whole core at %s: an XDP stage pays against TC for floods of that order, not below. ",
			saving*1e5/1e9*100, cores, mpps(0.1*cores*1e9/saving), mpps(1e9/saving))
	}
	fmt.Fprintf(&b, "Today `nic_ingress` stages each join and passes it on: %.0f ns a packet, %.0f more than the stack alone; "+
		"the node's %d cores are spent at %s. Dropping forged joins ahead of it would save %.0f ns a packet in XDP and "+
		"%.0f in TC: most of that is not staging them, the hook adds %.0f. ",
		nic, nic-stack, cores, mpps(cores*1e9/nic), nic-xdp, nic-tc, saving)
	b.WriteString("A real stage must let real joins through, which these programs do not: looking the join's token up " +
		"(a hash lookup, about 40 ns on these VMs, see the datapath section above) costs the same at either hook.\n")
	return b.String()
}

func lessOrMore(saving float64) string {
	if saving < 0 {
		return "more"
	}
	return "less"
}

// mpps says a rate in packets a second.
func mpps(pps float64) string {
	if pps >= 1e6 {
		return fmt.Sprintf("%.1f Mpps", pps/1e6)
	}
	return fmt.Sprintf("%.0f kpps", pps/1e3)
}

// gbits says a rate of frames of frameLen bytes in bits a second on the wire.
func gbits(pps float64, frameLen int) string {
	return fmt.Sprintf("%.1f Gbit/s", pps*wireBits(frameLen)/1e9)
}
