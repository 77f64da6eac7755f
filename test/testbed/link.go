package testbed

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// setupWire turns the wire namespace of one NIC into a transparent cable: a bridge joins the node side "n" and the
// fabric side "f"; a token bucket on the egress of each side caps one direction each; a clsact qdisc on both sides
// is where SetLoss attaches its drop filter.
func (b *Bed) setupWire(ctx context.Context, c NIC) error {
	if err := ipBatch(ctx, c.WireNS,
		"link add br0 type bridge stp_state 0 forward_delay 0",
		fmt.Sprintf("link set dev %s master br0", c.WireNodeSide),
		fmt.Sprintf("link set dev %s master br0", c.WireFabricSide),
		fmt.Sprintf("link set dev %s up", c.WireNodeSide),
		fmt.Sprintf("link set dev %s up", c.WireFabricSide),
		"link set br0 up",
	); err != nil {
		return err
	}
	var cmds []string
	for _, dev := range []string{c.WireNodeSide, c.WireFabricSide} {
		q, err := b.wireEndQdiscs(dev)
		if err != nil {
			return err
		}
		cmds = append(cmds, q...)
	}
	return tcBatch(ctx, c.WireNS, cmds...)
}

// wireEndQdiscs are the tc commands that give a wire end dev its rate (the bed's LinkRate, if any) and the clsact
// qdisc the loss and corruption filters hang on.
func (b *Bed) wireEndQdiscs(dev string) ([]string, error) {
	var cmds []string
	if b.Config.LinkRate != "" {
		tbf, err := tbfArgs(b.Config.LinkRate, b.Config.LinkQueue)
		if err != nil {
			return nil, err
		}
		cmds = append(cmds, fmt.Sprintf("qdisc add dev %s root %s", dev, tbf))
	}
	return append(cmds, fmt.Sprintf("qdisc add dev %s clsact", dev)), nil
}

// DefaultLinkQueue is how long a packet may wait in a link's queue: enough for a single TCP flow to keep the link
// busy at the bed's sub-millisecond RTTs (measured: see docs/testbed.md).
const DefaultLinkQueue = 20 * time.Millisecond

// MinLinkBurst is the least a link's token bucket holds, in bytes: what a link lets through at once, beyond its
// rate, after a pause.
const MinLinkBurst = 64 << 10

// tbfArgs chooses the token bucket for a rate. The bucket holds at least 64 KiB (one GSO super-packet, which TBF
// would otherwise have to split) or 2 ms at the rate, whichever is larger; the queue holds packets for queue
// (DefaultLinkQueue when 0), and TBF drops what would wait longer.
func tbfArgs(rate string, queue time.Duration) (string, error) {
	bps, err := ParseRate(rate)
	if err != nil {
		return "", err
	}
	if queue == 0 {
		queue = DefaultLinkQueue
	}
	burst := max(uint64(MinLinkBurst), uint64(bps/8*0.002))
	return fmt.Sprintf("tbf rate %s burst %d latency %dus", rate, burst, queue.Microseconds()), nil
}

// ParseRate parses a tc rate ("200mbit", "1gbit", "500kbit", "1000000bit") into bits per second.
func ParseRate(rate string) (float64, error) {
	s := strings.ToLower(strings.TrimSpace(rate))
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}} {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseFloat(num, 64)
			if err != nil || v <= 0 {
				return 0, fmt.Errorf("bad rate %q", rate)
			}
			return v * u.mult, nil
		}
	}
	return 0, fmt.Errorf("bad rate %q (want e.g. 200mbit)", rate)
}

func tcBatch(ctx context.Context, ns string, cmds ...string) error {
	if len(cmds) == 0 {
		return nil
	}
	cmd := exec.CommandContext(ctx, "tc", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("tc -n %s -batch [%s]: %w: %s", ns, strings.Join(cmds, "; "), err, out)
	}
	return nil
}

// Priorities of the bed's filters on a wire's clsact ingress: the
// corruption filter, the copy filter and the MP_CAPABLE stripper run first
// and pass every packet on (TC_ACT_UNSPEC), then the loss filter decides.
const (
	corruptPriority = 1
	copyPriority    = 2
	lossPriority    = 4
	stripPriority   = 3
)

// lossFilter is the state of one link's loss emulation.
type lossFilter struct {
	percent float64
	dir     Direction
}

// SetLinkRate gives NIC k of node i's link another rate, in tc syntax ("50mbit"), each way, with the queue of the
// bed's others: paths that differ. The bed must have a LinkRate (the wire ends' token buckets it changes).
func (b *Bed) SetLinkRate(i, k int, rate string) error {
	if b.Config.LinkRate == "" {
		return errors.New("link rate: the bed's links are unshaped (Config.LinkRate)")
	}
	tbf, err := tbfArgs(rate, b.Config.LinkQueue)
	if err != nil {
		return err
	}
	c := b.Node(i).NIC(k)
	return tcBatch(context.Background(), c.WireNS,
		fmt.Sprintf("qdisc change dev %s root %s", c.WireNodeSide, tbf),
		fmt.Sprintf("qdisc change dev %s root %s", c.WireFabricSide, tbf))
}

// SetLoss makes NIC k of node i drop percent of the packets (0..100) in each direction, independently at random,
// while its carrier stays up: a gray failure. 0 removes the loss.
//
// netem is not built into the bed's kernel (nor gact), so the drop is a tiny BPF program on the clsact ingress of
// both wire ends: it draws bpf_get_prandom_u32() and returns TC_ACT_SHOT below a threshold. The filter is replaced
// atomically on every change.
func (b *Bed) SetLoss(i, k int, percent float64) error {
	return b.setLoss(i, k, percent, both)
}

// both is the Direction of SetLoss: in and out.
const both Direction = ""

// SetOneWayLoss is SetLoss in one direction only (Out: what node i sends over NIC k; In: what it receives), the
// other direction untouched: a link that still delivers ACKs one way and nothing the other. The filter sits on the
// ingress of one wire end only (the node side for Out, the fabric side for In). Each call sets both directions: the
// one not named loses nothing.
func (b *Bed) SetOneWayLoss(i, k int, percent float64, d Direction) error {
	if d != Out && d != In {
		return fmt.Errorf("one-way loss: direction %q, want %q or %q", d, Out, In)
	}
	return b.setLoss(i, k, percent, d)
}

func (b *Bed) setLoss(i, k int, percent float64, d Direction) error {
	if percent < 0 || percent > 100 || math.IsNaN(percent) {
		return fmt.Errorf("loss %v%% out of range", percent)
	}
	c := b.Node(i).NIC(k)
	h, err := nsHandle(c.WireNS)
	if err != nil {
		return err
	}
	defer h.Close()

	var prog *ebpf.Program
	if percent > 0 {
		prog, err = lossProgram(percent)
		if err != nil {
			return err
		}
		defer prog.Close() // the filter holds its own reference
	}
	for _, end := range []struct {
		dev string
		dir Direction // the direction whose packets enter the wire at dev
	}{{c.WireNodeSide, Out}, {c.WireFabricSide, In}} {
		l, err := h.LinkByName(end.dev)
		if err != nil {
			return fmt.Errorf("%s in %s: %w", end.dev, c.WireNS, err)
		}
		f := &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{
				LinkIndex: l.Attrs().Index,
				Parent:    netlink.HANDLE_MIN_INGRESS,
				Handle:    1,
				Protocol:  unix.ETH_P_ALL,
				Priority:  lossPriority,
			},
			Name:         fmt.Sprintf("testbed-loss-%g", percent),
			DirectAction: true,
		}
		if prog == nil || (d != both && d != end.dir) {
			if err := h.FilterDel(f); err != nil && !isNotFound(err) {
				return fmt.Errorf("remove loss filter on %s/%s: %w", c.WireNS, end.dev, err)
			}
			continue
		}
		f.Fd = prog.FD()
		if err := h.FilterReplace(f); err != nil {
			return fmt.Errorf("loss filter on %s/%s: %w", c.WireNS, end.dev, err)
		}
	}
	b.mu.Lock()
	b.loss[[2]int{i, k}] = &lossFilter{percent: percent, dir: d}
	b.mu.Unlock()
	return nil
}

// SetCarrier takes the carrier of NIC k of node i away (up false) or gives it back (up true): the wire's node-side
// end is set administratively down or up, so nic<k> in the node stays up but sees NO-CARRIER (operstate
// LOWERLAYERDOWN or DOWN), as when a cable is pulled or the switch port dies. The kernel of the node gets a link
// event (RTM_NEWLINK without IFF_LOWER_UP, measured within a millisecond). The wire's qdiscs and filters stay;
// captures on the node side see nothing while the carrier is away.
//
// When the carrier comes back, the node's NIC and the wire's end are up within milliseconds, but traffic from the
// node may take up to a second more: packets sent while the carrier was away left the node's neighbour entry for
// its gateway INCOMPLETE, and the kernel asks again only at its next retry (every retrans_time, 1 s), not when the
// carrier returns; after about 3 s of retries the entry is FAILED and the next packet asks at once. Measured: round
// trips resumed 495-522 ms after a short outage (TestSetCarrierTakesTheNICsCarrierAwayAndBack). A real host does
// the same; tests that measure recovery count from SetCarrier's return and should say so.
func (b *Bed) SetCarrier(i, k int, up bool) error {
	c := b.Node(i).NIC(k)
	h, err := nsHandle(c.WireNS)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(c.WireNodeSide)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", c.WireNodeSide, c.WireNS, err)
	}
	if up {
		err = h.LinkSetUp(l)
	} else {
		err = h.LinkSetDown(l)
	}
	if err != nil {
		return fmt.Errorf("carrier of node %d nic%d (%s/%s) up=%v: %w", i, k, c.WireNS, c.WireNodeSide, up, err)
	}
	return nil
}

// RemoveNIC deletes NIC k of node i, as when a NIC is unplugged or its driver unbinds: the veth between the node and
// the wire goes, both ends, with everything on them (the node's addresses and routes over it, the wire end's qdiscs
// and filters, a capture on it). RestoreNIC puts it back.
func (b *Bed) RemoveNIC(i, k int) error {
	c := b.Node(i).NIC(k)
	if err := ipBatch(context.Background(), b.Node(i).NetNS, "link del "+c.Name); err != nil {
		return fmt.Errorf("removing node %d nic%d: %w", i, k, err)
	}
	return nil
}

// RestoreNIC creates NIC k of node i again after RemoveNIC, as a new link (a new ifindex) with the same name: the
// wire end joins its bridge with its rate again (not its loss or corruption filters), and the node gets the NIC's
// address back, and its default route if the NIC carried it (k = 1), as the host's network configuration would.
// Nothing else: what the agent programmed over the NIC (routes in its tables, its TC programs) is the agent's to
// restore.
func (b *Bed) RestoreNIC(i, k int) error {
	ctx := context.Background()
	n := b.Node(i)
	c := n.NIC(k)
	if err := ipBatch(ctx, n.NetNS, fmt.Sprintf("link add %s type veth peer name %s netns %s", c.Name, c.WireNodeSide, c.WireNS)); err != nil {
		return fmt.Errorf("restoring node %d nic%d: %w", i, k, err)
	}
	if err := ipBatch(ctx, c.WireNS, fmt.Sprintf("link set dev %s master br0", c.WireNodeSide), fmt.Sprintf("link set dev %s up", c.WireNodeSide)); err != nil {
		return err
	}
	q, err := b.wireEndQdiscs(c.WireNodeSide)
	if err != nil {
		return err
	}
	if err := tcBatch(ctx, c.WireNS, q...); err != nil {
		return err
	}
	cmds := []string{fmt.Sprintf("addr add %s dev %s", c.Addr, c.Name), fmt.Sprintf("link set dev %s up", c.Name)}
	if k == 1 {
		cmds = append(cmds, fmt.Sprintf("route replace default via %s dev %s", c.Gateway, c.Name))
	}
	return ipBatch(ctx, n.NetNS, cmds...)
}

// OperState returns the operational state of nic<k> in node i's namespace as the kernel reports it ("up", "down",
// "lower-layer-down", ...; netlink.LinkOperState's names) and whether it has a carrier (IFF_LOWER_UP).
func (b *Bed) OperState(i, k int) (state string, carrier bool, err error) {
	n := b.Node(i)
	h, err := nsHandle(n.NetNS)
	if err != nil {
		return "", false, err
	}
	defer h.Close()
	l, err := h.LinkByName(n.NIC(k).Name)
	if err != nil {
		return "", false, err
	}
	a := l.Attrs()
	return a.OperState.String(), a.RawFlags&unix.IFF_LOWER_UP != 0, nil
}

// Loss returns the loss SetLoss last set on NIC k of node i (or SetOneWayLoss, in the direction it named).
func (b *Bed) Loss(i, k int) float64 {
	p, _ := b.LossDirection(i, k)
	return p
}

// LossDirection returns the loss last set on NIC k of node i and the direction it applies to ("" for both).
func (b *Bed) LossDirection(i, k int) (float64, Direction) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l := b.loss[[2]int{i, k}]; l != nil {
		return l.percent, l.dir
	}
	return 0, both
}

func isNotFound(err error) bool {
	return errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), "no such file") || strings.Contains(err.Error(), "not found")
}

// lossProgram builds: if (bpf_get_prandom_u32() < threshold) return TC_ACT_SHOT; return TC_ACT_OK;
func lossProgram(percent float64) (*ebpf.Program, error) {
	threshold := int64(math.Round(percent / 100 * (1 << 32)))
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "testbed_loss",
		Type: ebpf.SchedCLS,
		Instructions: asm.Instructions{
			asm.FnGetPrandomU32.Call(),
			asm.LoadImm(asm.R1, threshold, asm.DWord),
			asm.JLT.Reg(asm.R0, asm.R1, "drop"),
			asm.Mov.Imm(asm.R0, 0), // TC_ACT_OK
			asm.Return(),
			asm.Mov.Imm(asm.R0, 2).WithSymbol("drop"), // TC_ACT_SHOT
			asm.Return(),
		},
		License: "GPL",
	})
}

// nsHandle opens a netlink handle inside namespace ns without moving the calling thread.
func nsHandle(ns string) (*netlink.Handle, error) {
	nsh, err := netns.GetFromName(ns)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", ns, err)
	}
	defer nsh.Close()
	return netlink.NewHandleAt(nsh)
}
