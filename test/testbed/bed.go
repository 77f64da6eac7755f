// Package testbed builds a multi-node, multi-NIC network out of Linux network namespaces, on one machine, for the
// tests, benchmarks and demo of mptcp-operator. See docs/testbed.md for the picture.
//
// A bed has N nodes, each with K NICs and P pods. NIC k of every node is cabled through a "wire" namespace (a
// transparent bridge that holds the link's rate limit and loss) to fabric k, a router namespace that routes pod
// CIDRs over path k. Nothing is ever created in the machine's own network namespace: veth pairs are created with
// both ends already inside bed namespaces.
package testbed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Config sizes a bed. Indexes are 1-based everywhere: node i, NIC k, pod j.
type Config struct {
	// Name is the bed's unique prefix for every namespace it creates ("mpt" and 6 hex digits when empty). Keep it
	// short and unique per bed: Sweep and Down find everything by it.
	Name string
	// Nodes is the number of nodes (N), at most 200.
	Nodes int
	// NICs is the number of NICs per node (K), at most 100: NIC k uses 10.(100+k).0.0/16.
	NICs int
	// PodsPerNode is the number of pods per node (P), at most 200.
	PodsPerNode int
	// LinkRate caps each direction of every NIC's link, in tc syntax ("200mbit"); empty leaves links unshaped.
	LinkRate string
	// LinkQueue is how long a packet may wait in a shaped link's queue before the link drops it (tail drop);
	// DefaultLinkQueue when 0.
	LinkQueue time.Duration
	// Underlay makes the fabrics an overlay's underlay: they route each node's Loopback address (on its lo) and no
	// pod CIDR, so pods of different nodes reach each other only through a tunnel between those addresses.
	Underlay bool
	// SharedLAN makes each fabric one layer-2 segment, as a rack's switch: every node's NIC k holds its address in
	// 10.(100+k).0.0/16 and reaches the other nodes' NIC k directly; the fabric's addresses on it stay each node's
	// gateway, and the fabric routes nothing beyond the segment (no pod CIDR, no Loopback), as a host-gw
	// cluster's fabrics do not. It excludes Underlay.
	SharedLAN bool
}

// Bed is a running test bed. Its exported fields describe the topology; it is torn down by Down.
type Bed struct {
	Name   string
	Config Config
	Nodes  []*Node
	// Fabrics are the fabric namespaces, Fabrics[k-1] for path k.
	Fabrics []string
	// Dir is a scratch directory for process logs and captures; Down removes it unless KeepDir is set.
	Dir     string
	KeepDir bool

	mu        sync.Mutex
	procs     []*Process
	loss      map[[2]int]*lossFilter
	handRoute bool // HandRoute is installed (RemoveHandRoute clears it)
	// awaitJoins is, per client pod, the joins its kernel path manager
	// opens, which Send waits for before the first byte (AwaitJoins).
	awaitJoins map[*Pod]int
	down       bool
	seq        int // for file names that must never repeat within a bed
}

// nextSeq returns a number no earlier call returned.
func (b *Bed) nextSeq() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	return b.seq
}

// Node is a namespace standing for a Kubernetes node.
type Node struct {
	Index   int
	NetNS   string
	NICs    []NIC
	Pods    []*Pod
	PodCIDR netip.Prefix
	// Loopback is 10.100.0.i, on the node's lo and routed by every fabric when Config.Underlay is set (an
	// overlay's tunnel endpoint).
	Loopback netip.Addr
}

// NIC is one of a node's uplinks: nic<k> in the node namespace, cabled through WireNS to fabric k.
type NIC struct {
	Index int
	// Name is the interface name in the node namespace, "nic<k>".
	Name string
	// Addr is 10.(100+k).i.2/24.
	Addr netip.Prefix
	// Gateway is fabric k's address on this link, 10.(100+k).i.1.
	Gateway netip.Addr
	// WireNS holds the link emulation; WireNodeSide ("n") faces the node, WireFabricSide ("f") the fabric.
	WireNS         string
	WireNodeSide   string
	WireFabricSide string
	// FabricNS is the fabric namespace and FabricIf the interface there ("n<i>").
	FabricNS string
	FabricIf string
}

// Pod is a namespace standing for a pod, attached to its node by a routed veth ("ptp" CNI).
type Pod struct {
	Name  string
	NetNS string
	Addr  netip.Addr
	// HostIf is the node-side veth, "vpod<j>".
	HostIf string
	Node   *Node
}

// NodeNS, WireNS, FabricNS and PodNS name the namespaces of a bed with prefix p.
func NodeNS(p string, i int) string    { return fmt.Sprintf("%s-node%d", p, i) }
func WireNS(p string, i, k int) string { return fmt.Sprintf("%s-w%d-%d", p, i, k) }
func FabricNS(p string, k int) string  { return fmt.Sprintf("%s-fab%d", p, k) }
func PodNS(p string, i, j int) string  { return fmt.Sprintf("%s-n%dp%d", p, i, j) }
func nicAddr(i, k int) netip.Addr      { return netip.AddrFrom4([4]byte{10, byte(100 + k), byte(i), 2}) }
func fabricAddr(i, k int) netip.Addr   { return netip.AddrFrom4([4]byte{10, byte(100 + k), byte(i), 1}) }
func podAddr(i, j int) netip.Addr      { return netip.AddrFrom4([4]byte{10, 244, byte(i), byte(10 + j)}) }
func podGateway(i int) netip.Addr      { return netip.AddrFrom4([4]byte{10, 244, byte(i), 1}) }
func podCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)
}
func nicPrefix(i, k int, sharedLAN bool) netip.Prefix {
	if sharedLAN {
		return netip.PrefixFrom(nicAddr(i, k), 16)
	}
	return netip.PrefixFrom(nicAddr(i, k), 24)
}

// NewName returns a fresh bed prefix, "mpt" and 6 random hex digits.
func NewName() string {
	var b [3]byte
	rand.Read(b[:])
	return "mpt" + hex.EncodeToString(b[:])
}

// Node returns node i (1-based).
func (b *Bed) Node(i int) *Node { return b.Nodes[i-1] }

// Pod returns pod j of node i (1-based).
func (b *Bed) Pod(i, j int) *Pod { return b.Nodes[i-1].Pods[j-1] }

// AddPod makes a pod that something else created (a real node's, attached
// with nodes.Cluster.AttachPod) one of its node's pods: Pod(i, j) finds it
// after the bed's own, and a watch's evidence covers it. Its namespace's
// name must start with the bed's prefix, so that Down removes it.
func (b *Bed) AddPod(p *Pod) error {
	if p.Node == nil || !strings.HasPrefix(p.NetNS, b.Name+"-") {
		return fmt.Errorf("pod %s (namespace %q) is not of bed %s", p.Name, p.NetNS, b.Name)
	}
	p.Node.Pods = append(p.Node.Pods, p)
	return nil
}

// NIC returns NIC k (1-based) of the node.
func (n *Node) NIC(k int) NIC { return n.NICs[k-1] }

// Up builds a bed. On error everything it created so far is removed.
func Up(ctx context.Context, cfg Config) (*Bed, error) {
	if cfg.Name == "" {
		cfg.Name = NewName()
	}
	if strings.ContainsAny(cfg.Name, "/ \t") || len(cfg.Name) > 20 {
		return nil, fmt.Errorf("bad bed name %q", cfg.Name)
	}
	if cfg.SharedLAN && cfg.Underlay {
		return nil, errors.New("a bed's fabrics are a shared LAN or an underlay, not both")
	}
	if cfg.Nodes < 1 || cfg.Nodes > 200 || cfg.NICs < 1 || cfg.NICs > 100 || cfg.PodsPerNode < 0 || cfg.PodsPerNode > 200 {
		return nil, fmt.Errorf("bed size out of range: %d nodes, %d NICs, %d pods per node", cfg.Nodes, cfg.NICs, cfg.PodsPerNode)
	}
	// Pins need bpffs; a fresh machine has none mounted.
	if err := ensureBPFFS(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "testbed-"+cfg.Name+"-")
	if err != nil {
		return nil, err
	}
	b := &Bed{Name: cfg.Name, Config: cfg, Dir: dir, loss: map[[2]int]*lossFilter{}}
	b.describe()
	if err := b.claim(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := b.build(ctx); err != nil {
		if derr := b.Down(); derr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup after failed Up: %w", derr))
		}
		return nil, err
	}
	return b, nil
}

// describe fills in the topology from the config; build then makes it real.
func (b *Bed) describe() {
	p := b.Name
	for k := 1; k <= b.Config.NICs; k++ {
		b.Fabrics = append(b.Fabrics, FabricNS(p, k))
	}
	for i := 1; i <= b.Config.Nodes; i++ {
		n := &Node{Index: i, NetNS: NodeNS(p, i), PodCIDR: podCIDR(i), Loopback: netip.AddrFrom4([4]byte{10, 100, 0, byte(i)})}
		for k := 1; k <= b.Config.NICs; k++ {
			n.NICs = append(n.NICs, NIC{
				Index: k, Name: fmt.Sprintf("nic%d", k), Addr: nicPrefix(i, k, b.Config.SharedLAN), Gateway: fabricAddr(i, k),
				WireNS: WireNS(p, i, k), WireNodeSide: "n", WireFabricSide: "f",
				FabricNS: FabricNS(p, k), FabricIf: fmt.Sprintf("n%d", i),
			})
		}
		for j := 1; j <= b.Config.PodsPerNode; j++ {
			n.Pods = append(n.Pods, &Pod{
				Name: fmt.Sprintf("n%dp%d", i, j), NetNS: PodNS(p, i, j), Addr: podAddr(i, j),
				HostIf: fmt.Sprintf("vpod%d", j), Node: n,
			})
		}
		b.Nodes = append(b.Nodes, n)
	}
}

// Namespaces lists every namespace of the bed.
func (b *Bed) Namespaces() []string {
	var out []string
	for _, n := range b.Nodes {
		out = append(out, n.NetNS)
		for _, c := range n.NICs {
			out = append(out, c.WireNS)
		}
		for _, p := range n.Pods {
			out = append(out, p.NetNS)
		}
	}
	return append(out, b.Fabrics...)
}

func (b *Bed) build(ctx context.Context) error {
	for _, ns := range b.Namespaces() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := run(ctx, "ip", "netns", "add", ns); err != nil {
			return err
		}
	}
	// Sysctls first, so that interfaces created afterwards inherit the "default" values.
	for _, n := range b.Nodes {
		if err := b.sysctl(ctx, n.NetNS,
			"net.ipv4.ip_forward=1",
			"net.ipv4.conf.all.rp_filter=1",
			"net.ipv4.conf.default.rp_filter=1",
			"net.ipv6.conf.all.forwarding=1",
			"net.ipv6.conf.default.forwarding=1",
		); err != nil {
			return err
		}
		for _, c := range n.NICs {
			// The wire is a layer-2 cable: no IPv6 link-local chatter in captures.
			if err := b.sysctl(ctx, c.WireNS, "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"); err != nil {
				return err
			}
		}
	}
	for _, f := range b.Fabrics {
		if err := b.sysctl(ctx, f,
			"net.ipv4.ip_forward=1",
			"net.ipv4.conf.all.rp_filter=0",
			"net.ipv4.conf.default.rp_filter=0",
			"net.ipv4.conf.all.send_redirects=0",
			"net.ipv4.conf.default.send_redirects=0",
		); err != nil {
			return err
		}
	}

	// Cables. Each veth is created with both ends already inside bed namespaces.
	for _, n := range b.Nodes {
		for _, c := range n.NICs {
			if err := ipBatch(ctx, n.NetNS, fmt.Sprintf("link add %s type veth peer name %s netns %s", c.Name, c.WireNodeSide, c.WireNS)); err != nil {
				return err
			}
			if err := ipBatch(ctx, c.WireNS, fmt.Sprintf("link add %s type veth peer name %s netns %s", c.WireFabricSide, c.FabricIf, c.FabricNS)); err != nil {
				return err
			}
		}
		for _, p := range n.Pods {
			if err := ipBatch(ctx, n.NetNS, fmt.Sprintf("link add %s type veth peer name eth0 netns %s", p.HostIf, p.NetNS)); err != nil {
				return err
			}
		}
	}

	for _, n := range b.Nodes {
		for _, c := range n.NICs {
			if err := b.setupWire(ctx, c); err != nil {
				return err
			}
		}
		if err := b.setupNode(ctx, n); err != nil {
			return err
		}
		for _, p := range n.Pods {
			if err := ipBatch(ctx, p.NetNS,
				"link set lo up",
				fmt.Sprintf("addr add %s/24 dev eth0", p.Addr),
				"link set eth0 up",
				fmt.Sprintf("route add default via %s dev eth0 onlink", podGateway(n.Index)),
			); err != nil {
				return err
			}
		}
	}
	for k, f := range b.Fabrics {
		cmds := []string{"link set lo up"}
		if b.Config.SharedLAN {
			cmds = append(cmds, "link add lan type bridge", "link set lan up")
		}
		for _, n := range b.Nodes {
			c := n.NICs[k]
			if b.Config.SharedLAN {
				// The nodes' cables are the bridge's ports; the gateways are the bridge's addresses.
				cmds = append(cmds,
					fmt.Sprintf("link set dev %s master lan", c.FabricIf),
					fmt.Sprintf("link set dev %s up", c.FabricIf),
					fmt.Sprintf("addr add %s/16 dev lan", c.Gateway),
				)
				continue
			}
			cmds = append(cmds,
				fmt.Sprintf("addr add %s/24 dev %s", c.Gateway, c.FabricIf),
				fmt.Sprintf("link set dev %s up", c.FabricIf),
			)
			routed := n.PodCIDR.String()
			if b.Config.Underlay {
				routed = n.Loopback.String() + "/32"
			}
			cmds = append(cmds, fmt.Sprintf("route add %s via %s dev %s", routed, c.Addr.Addr(), c.FabricIf))
		}
		if err := ipBatch(ctx, f, cmds...); err != nil {
			return err
		}
	}
	return nil
}

func (b *Bed) setupNode(ctx context.Context, n *Node) error {
	cmds := []string{"link set lo up"}
	if b.Config.Underlay {
		cmds = append(cmds, fmt.Sprintf("addr add %s/32 dev lo", n.Loopback))
	}
	for _, c := range n.NICs {
		cmds = append(cmds, fmt.Sprintf("addr add %s dev %s", c.Addr, c.Name), fmt.Sprintf("link set dev %s up", c.Name))
	}
	cmds = append(cmds, fmt.Sprintf("route add default via %s dev %s", n.NICs[0].Gateway, n.NICs[0].Name))
	for _, p := range n.Pods {
		cmds = append(cmds,
			fmt.Sprintf("addr add %s/32 dev %s", podGateway(n.Index), p.HostIf),
			fmt.Sprintf("link set dev %s up", p.HostIf),
			fmt.Sprintf("route add %s/32 dev %s", p.Addr, p.HostIf),
		)
	}
	if err := ipBatch(ctx, n.NetNS, cmds...); err != nil {
		return err
	}
	// Proxy ARP on the host veths lets two pods of the same node reach each other through the node although their
	// /24 says "on link", as routed CNIs do. Without proxy_delay=0 (Calico sets it too) the first resolution was
	// seen to fail for over a second.
	var sc []string
	for _, p := range n.Pods {
		sc = append(sc, fmt.Sprintf("net.ipv4.conf.%s.proxy_arp=1", p.HostIf), fmt.Sprintf("net.ipv4.neigh.%s.proxy_delay=0", p.HostIf))
	}
	if len(sc) == 0 {
		return nil
	}
	return b.sysctl(ctx, n.NetNS, sc...)
}

// claim records the owner of the bed's prefix, so that SweepStale can tell a crashed run's leftovers from a bed
// that is in use by another process.
func (b *Bed) claim() error {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(stateDir, b.Name+".owner"), []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644)
}

// Down stops every process the bed started (SIGTERM, then SIGKILL after a grace period), deletes every namespace
// and removes the bed's pin directory and scratch directory. It removes leftovers of this bed's prefix too (the
// same as Sweep), so it is safe to call after a partial Up, and more than once.
func (b *Bed) Down() error {
	b.mu.Lock()
	procs := b.procs
	b.procs = nil
	b.down = true
	b.mu.Unlock()

	var errs []error
	for _, p := range procs {
		if err := p.Stop(3 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := Sweep(b.Name); err != nil {
		errs = append(errs, err)
	}
	if !b.KeepDir {
		os.RemoveAll(b.Dir)
	}
	return errors.Join(errs...)
}
