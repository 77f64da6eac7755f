package testbed

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Captures are packet captures running on every wire of a bed.
type Captures struct {
	// Files lists one capture per (node, NIC), in node then NIC order.
	Files   []CaptureFile
	procs   []*Process
	stopped bool
	stopErr error
}

// CaptureFile is the capture of one NIC's wire.
type CaptureFile struct {
	Node, NIC int
	Path      string
	// NodeMAC is the MAC address of nic<k> in the node: frames from it go out of the node, all others come in.
	NodeMAC string
}

// StartCaptures starts dumpcap in every wire namespace on the node-side interface "n", which sees both directions
// of that NIC, with a 128-byte snap length (headers and TCP options, no payload) and the capture filter (pcap
// syntax, e.g. "tcp"; "" captures everything). It returns once every dumpcap is capturing.
func (b *Bed) StartCaptures(filter string) (*Captures, error) {
	return b.startCaptures(filter, headerSnap)
}

// StartPayloadCaptures is StartCaptures keeping every byte of every packet.
func (b *Bed) StartPayloadCaptures(filter string) (*Captures, error) {
	return b.startCaptures(filter, 0)
}

// headerSnap keeps Ethernet, IP and TCP headers with the longest options (14 + 60 + 60 bytes would be the
// worst case; IPv4 options are rare on the bed).
const headerSnap = 128

// tunnelPorts are the UDP ports of the overlays' VXLAN: flannel's (Linux's default) and Calico's (IANA's). On an
// underlay bed (Config.Underlay) the captures read the pods' segments inside it, behind its 50 bytes of outer headers.
var tunnelPorts = []uint16{8472, 4789}

// isTunnelPort tells whether a UDP destination port is one of tunnelPorts.
func isTunnelPort(port uint16) bool { return slices.Contains(tunnelPorts, port) }

func (b *Bed) startCaptures(filter string, snap int) (*Captures, error) {
	if b.Config.Underlay && snap != 0 {
		snap += 50
	}
	if b.Config.Underlay && filter != "" {
		filter = fmt.Sprintf("(%s) or udp port %d or udp port %d", filter, tunnelPorts[0], tunnelPorts[1])
	}
	c := &Captures{}
	seq := b.nextSeq()
	for _, n := range b.Nodes {
		h, err := nsHandle(n.NetNS)
		if err != nil {
			return nil, err
		}
		for _, nic := range n.NICs {
			l, err := h.LinkByName(nic.Name)
			if err != nil {
				h.Close()
				return nil, err
			}
			f := CaptureFile{
				Node: n.Index, NIC: nic.Index, NodeMAC: l.Attrs().HardwareAddr.String(),
				Path: filepath.Join(b.Dir, fmt.Sprintf("capture-%s-%d-node%d-nic%d.pcapng", b.Name, seq, n.Index, nic.Index)),
			}
			args := []string{"dumpcap", "-q", "-i", nic.WireNodeSide, "-w", f.Path}
			if snap > 0 {
				args = append(args, "-s", strconv.Itoa(snap))
			}
			if filter != "" {
				args = append(args, "-f", filter)
			}
			p, err := b.Start(nic.WireNS, args...)
			if err != nil {
				h.Close()
				_, _ = c.Stop()
				return nil, err
			}
			c.Files = append(c.Files, f)
			c.procs = append(c.procs, p)
		}
		h.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, p := range c.procs {
		// dumpcap prints the file name once the interface is open and the filter installed.
		if err := p.WaitOutput(ctx, "File: "); err != nil {
			_, _ = c.Stop()
			return nil, err
		}
	}
	return c, nil
}

// ringFlush is how long libpcap may hold captured packets in a memory-mapped
// ring block before handing them to dumpcap (TPACKET_V3's block timeout).
// Packets still in a block when dumpcap is stopped are lost, so Stop waits
// this long first.
const ringFlush = 1200 * time.Millisecond

// Stop stops every dumpcap (SIGINT, so each finishes its file) and returns the files. Stopping again returns
// the same.
func (c *Captures) Stop() ([]CaptureFile, error) { return c.stop(ringFlush) }

// Discard stops every dumpcap at once, without waiting for the ring to
// flush, and removes the files: for captures nobody will read (a transfer
// that passed), where the wait would be a second lost per transfer.
func (c *Captures) Discard() {
	files, _ := c.stop(0)
	for _, f := range files {
		_ = os.Remove(f.Path)
	}
}

func (c *Captures) stop(flush time.Duration) ([]CaptureFile, error) {
	if c.stopped {
		return c.Files, c.stopErr
	}
	c.stopped = true
	time.Sleep(flush)
	for _, p := range c.procs {
		_ = p.Signal(syscall.SIGINT)
	}
	var errs []error
	for _, p := range c.procs {
		select {
		case <-p.Done():
		case <-time.After(5 * time.Second):
			errs = append(errs, p.Stop(time.Second))
		}
	}
	c.stopErr = errors.Join(errs...)
	return c.Files, c.stopErr
}

// Direction is the way a packet crossed a NIC, seen from the node: "out" leaves the node, "in" enters it.
type Direction string

const (
	Out Direction = "out"
	In  Direction = "in"
)

// Sighting says that packets of a subflow crossed NIC k of a node in one direction. Packets counts those Analyze
// read: the control segments and the first few of each direction (FlowHeads), not all of them.
type Sighting struct {
	Node, NIC int
	Dir       Direction
	Packets   int
}

// Subflow kinds, from the options of the subflow's first SYN.
const (
	KindMPCapable = "MP_CAPABLE" // the first subflow of an MPTCP connection
	KindMPJoin    = "MP_JOIN"    // an additional subflow
	KindTCP       = "TCP"        // no MPTCP option on the SYN
	KindUnknown   = "unknown"    // the SYN was not captured
)

// Subflow is one TCP subflow (one 4-tuple) as the captures saw it.
type Subflow struct {
	// Src is the initiator (sender of the SYN), Dst the responder.
	Src, Dst netip.AddrPort
	Kind     string
	// JoinToken is the token carried by an MP_JOIN SYN: the responder's token (RFC 8684 3.2).
	JoinToken uint32
	// Conn identifies the MPTCP connection: the token of the responder of its MP_CAPABLE subflow (derived by tshark
	// from the key in the SYN/ACK, mptcp.expected_token), the token every join toward that responder carries. 0
	// when unknown.
	Conn uint32
	// Seen lists where packets were seen, sorted by node, NIC, direction.
	Seen []Sighting
	// Opened is when the first of its SYNs was captured; zero when none
	// was (the subflow began before the captures).
	Opened time.Time
}

// String renders a subflow for test messages.
func (s *Subflow) String() string {
	return fmt.Sprintf("%s %s->%s conn %08x seen %v", s.Kind, s.Src, s.Dst, s.Conn, s.Seen)
}

// NICs returns the NIC indexes of node on which the subflow was seen in direction dir.
func (s *Subflow) NICs(node int, dir Direction) []int {
	var out []int
	for _, x := range s.Seen {
		if x.Node == node && x.Dir == dir {
			out = append(out, x.NIC)
		}
	}
	return out
}

// PlacedOn returns the one NIC of node that carried the subflow in both directions, or false if it was seen on
// none, on several, or in one direction only.
func (s *Subflow) PlacedOn(node int) (int, bool) {
	out, in := s.NICs(node, Out), s.NICs(node, In)
	if len(out) == 1 && len(in) == 1 && out[0] == in[0] {
		return out[0], true
	}
	return 0, false
}

// Connection is an MPTCP connection and its subflows.
type Connection struct {
	Token    uint32
	Subflows []*Subflow
}

// Analysis is what the captures show.
type Analysis struct {
	Subflows    []*Subflow
	Connections []*Connection
	// Tunneled and Plain count the TCP segments read inside VXLAN and not (captures cut to their flows' heads).
	Tunneled, Plain int
}

// Analyze stops the captures if they still run and decodes them with Analyze.
func (c *Captures) Analyze() (*Analysis, error) {
	files, err := c.Stop()
	if err != nil {
		return nil, err
	}
	return Analyze(files)
}

// Analyze decodes captures with tshark, which understands every MPTCP option (RFC 8684). For each node, its NICs'
// captures are merged (mergecap -I none keeps one interface per file, so frame.interface_id tells the NIC) and
// decoded with MPTCP analysis on ("mptcp.analyze_mptcp", the tshark 4.0 preference name), which links each join
// to its connection (mptcp.stream) and derives tokens from keys (mptcp.expected_token). Keys themselves are never
// extracted. Subflows seen on several nodes are merged by 4-tuple, connections by token.
//
// tshark reads a cut of each capture (FlowHeads), not every data segment: the same subflows, kinds, connections
// and NICs, in a second where the whole captures of a transfer took a minute.
func Analyze(files []CaptureFile) (*Analysis, error) {
	heads, err := FlowHeads(files)
	if err != nil {
		return nil, err
	}
	// tshark reads each node's captures at once (the slow part, one
	// process a node); their rows are then taken in node order.
	nodes := byNode(ControlFiles(heads))
	rows, errs := make([][]byte, len(nodes)), make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, files := range nodes {
		wg.Go(func() { rows[i], errs[i] = nodeRows(files) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	a := &analyzer{subflows: map[[2]netip.AddrPort]*subflowAcc{}}
	for i, files := range nodes {
		if err := a.node(files[0].Node, files, rows[i]); err != nil {
			return nil, err
		}
	}
	return a.result(), nil
}

type subflowAcc struct {
	sf    *Subflow
	seen  map[Sighting]int // Packets zero in the key
	synOK bool
}

type analyzer struct {
	subflows        map[[2]netip.AddrPort]*subflowAcc
	tunneled, plain int
}

// tsharkFields are the fields Analyze reads, in order.
var tsharkFields = []string{
	"frame.interface_id", "eth.src", "ip.src", "tcp.srcport", "ip.dst", "tcp.dstport",
	"tcp.flags.syn", "tcp.flags.ack", "mptcp.stream", "tcp.options.mptcp.subtype",
	"tcp.options.mptcp.recvtok", "mptcp.expected_token", "frame.time_epoch", "vxlan.vni",
}

// mergeNode merges one node's captures, sorted by NIC, into one file whose frame.interface_id is the index of the
// NIC's capture in files (mergecap -I none keeps one interface per input file), and returns its path.
func mergeNode(files []CaptureFile) (string, error) {
	slices.SortFunc(files, func(x, y CaptureFile) int { return x.NIC - y.NIC })
	if len(files) == 1 {
		return files[0].Path, nil
	}
	merged := strings.TrimSuffix(files[0].Path, ".pcapng") + "-merged.pcapng"
	args := []string{"-I", "none", "-w", merged}
	for _, f := range files {
		args = append(args, f.Path)
	}
	if out, err := exec.Command("mergecap", args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("mergecap: %w: %s", err, out)
	}
	return merged, nil
}

// byNode groups captures by node, in node order.
func byNode(files []CaptureFile) [][]CaptureFile {
	m := map[int][]CaptureFile{}
	var nodes []int
	for _, f := range files {
		if _, ok := m[f.Node]; !ok {
			nodes = append(nodes, f.Node)
		}
		m[f.Node] = append(m[f.Node], f)
	}
	slices.Sort(nodes)
	out := make([][]CaptureFile, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, m[n])
	}
	return out
}

// tsharkRows runs tshark on the capture input and returns one line per
// packet that filter keeps: fields separated by '|', a field that occurs
// several times in the packet joined by ',' (all) or its first occurrence
// only; prefs are tshark preferences (-o).
func tsharkRows(input, filter string, all bool, fields []string, prefs ...string) ([]byte, error) {
	args := []string{"-n", "-r", input}
	for _, p := range prefs {
		args = append(args, "-o", p)
	}
	for _, port := range tunnelPorts {
		args = append(args, "-d", fmt.Sprintf("udp.port==%d,vxlan", port))
	}
	args = append(args, "-Y", filter, "-T", "fields", "-E", "separator=|")
	if all {
		args = append(args, "-E", "occurrence=a", "-E", "aggregator=,")
	} else {
		args = append(args, "-E", "occurrence=f")
	}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	cmd := exec.Command("tshark", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("tshark on %s: %w: %s", input, err, stderr.String())
	}
	return out, nil
}

// nodeRows are tshark's rows of tsharkFields for one node's captures,
// merged.
func nodeRows(files []CaptureFile) ([]byte, error) {
	input, err := mergeNode(files)
	if err != nil {
		return nil, err
	}
	return tsharkRows(input, "tcp && ip", true, tsharkFields, "mptcp.analyze_mptcp:TRUE")
}

func (a *analyzer) node(node int, files []CaptureFile, out []byte) error {

	type pkt struct {
		nic             int
		out             bool
		src, dst        netip.AddrPort
		syn, ack        bool
		stream          string
		subtypes        []string
		recvtok, exptok uint32
		at              time.Time
	}
	var pkts []pkt
	streamToken := map[string]uint32{} // mptcp.stream -> token of its MP_CAPABLE responder
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "|")
		if len(f) != len(tsharkFields) {
			continue
		}
		iface, err := strconv.Atoi(f[0])
		if err != nil || iface >= len(files) {
			return fmt.Errorf("tshark: bad interface id %q", f[0])
		}
		// Inside VXLAN the outer frame's fields come first: the wire's
		// Ethernet source, the inner packet's addresses.
		last := func(s string) string { return s[strings.LastIndexByte(s, ',')+1:] }
		f[1], _, _ = strings.Cut(f[1], ",")
		src, err1 := addrPort(last(f[2]), f[3])
		dst, err2 := addrPort(last(f[4]), f[5])
		if err1 != nil || err2 != nil {
			continue
		}
		p := pkt{
			nic: files[iface].NIC, out: strings.EqualFold(f[1], files[iface].NodeMAC), src: src, dst: dst,
			syn: f[6] == "1" || f[6] == "True", ack: f[7] == "1" || f[7] == "True", stream: f[8],
			recvtok: firstUint32(f[10]), exptok: firstUint32(f[11]), at: EpochTime(f[12]),
		}
		if f[9] != "" {
			p.subtypes = strings.Split(f[9], ",")
		}
		// The SYN/ACK of an MP_CAPABLE handshake carries the responder's key; tshark turns it into its token.
		if p.syn && p.ack && slices.Contains(p.subtypes, "0") && p.stream != "" && p.exptok != 0 {
			streamToken[p.stream] = p.exptok
		}
		pkts = append(pkts, p)
		if f[13] != "" {
			a.tunneled++
		} else {
			a.plain++
		}
	}
	for _, p := range pkts {
		// The key is (initiator, responder); a SYN/ACK travels from the responder.
		key := [2]netip.AddrPort{p.src, p.dst}
		if _, ok := a.subflows[key]; !ok {
			if _, ok := a.subflows[[2]netip.AddrPort{p.dst, p.src}]; ok || (p.syn && p.ack) {
				key = [2]netip.AddrPort{p.dst, p.src}
			}
		}
		acc := a.subflows[key]
		if acc == nil {
			acc = &subflowAcc{sf: &Subflow{Src: key[0], Dst: key[1], Kind: KindUnknown}, seen: map[Sighting]int{}}
			a.subflows[key] = acc
		}
		dir := In
		if p.out {
			dir = Out
		}
		acc.seen[Sighting{Node: node, NIC: p.nic, Dir: dir}]++
		if p.syn && !p.ack && (acc.sf.Opened.IsZero() || p.at.Before(acc.sf.Opened)) {
			acc.sf.Opened = p.at
		}
		if p.syn && !p.ack && !acc.synOK {
			acc.synOK = true
			switch {
			case slices.Contains(p.subtypes, "0"):
				acc.sf.Kind = KindMPCapable
			case slices.Contains(p.subtypes, "1"):
				acc.sf.Kind = KindMPJoin
				acc.sf.JoinToken = p.recvtok
			default:
				acc.sf.Kind = KindTCP
			}
		}
		if acc.sf.Conn == 0 && p.stream != "" {
			acc.sf.Conn = streamToken[p.stream]
		}
	}
	return nil
}

func (a *analyzer) result() *Analysis {
	res := &Analysis{Tunneled: a.tunneled, Plain: a.plain}
	conns := map[uint32]*Connection{}
	for _, acc := range a.subflows {
		sf := acc.sf
		if sf.Conn == 0 && sf.Kind == KindMPJoin {
			sf.Conn = sf.JoinToken // the SYN/ACK with the key was not captured; the join still names its peer
		}
		for s, n := range acc.seen {
			s.Packets = n
			sf.Seen = append(sf.Seen, s)
		}
		slices.SortFunc(sf.Seen, func(x, y Sighting) int {
			if x.Node != y.Node {
				return x.Node - y.Node
			}
			if x.NIC != y.NIC {
				return x.NIC - y.NIC
			}
			return strings.Compare(string(x.Dir), string(y.Dir))
		})
		res.Subflows = append(res.Subflows, sf)
		if sf.Conn != 0 {
			c := conns[sf.Conn]
			if c == nil {
				c = &Connection{Token: sf.Conn}
				conns[sf.Conn] = c
				res.Connections = append(res.Connections, c)
			}
			c.Subflows = append(c.Subflows, sf)
		}
	}
	cmpSub := func(x, y *Subflow) int {
		if x.Kind != y.Kind {
			return kindRank(x.Kind) - kindRank(y.Kind)
		}
		if c := x.Src.Compare(y.Src); c != 0 {
			return c
		}
		return x.Dst.Compare(y.Dst)
	}
	slices.SortFunc(res.Subflows, cmpSub)
	for _, c := range res.Connections {
		slices.SortFunc(c.Subflows, cmpSub)
	}
	slices.SortFunc(res.Connections, func(x, y *Connection) int { return cmpSub(x.Subflows[0], y.Subflows[0]) })
	return res
}

func addrPort(ip, port string) (netip.AddrPort, error) {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return netip.AddrPort{}, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(a, uint16(p)), nil
}

// EpochTime parses tshark's frame.time_epoch (seconds since 1970 with a
// fraction); zero when it is not one.
func EpochTime(s string) time.Time {
	sec, frac, _ := strings.Cut(s, ".")
	whole, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}
	}
	var ns int64
	if frac != "" {
		frac = (frac + "000000000")[:9]
		if ns, err = strconv.ParseInt(frac, 10, 64); err != nil {
			return time.Time{}
		}
	}
	return time.Unix(whole, ns)
}

func firstUint32(s string) uint32 {
	s, _, _ = strings.Cut(s, ",")
	if s == "" {
		return 0
	}
	v, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return 0
	}
	return uint32(v)
}

// kindRank orders subflows: a connection's first subflow, then its joins.
func kindRank(kind string) int {
	return slices.Index([]string{KindMPCapable, KindMPJoin, KindTCP, KindUnknown}, kind)
}

// CheckPlacement checks what the e2e tests ask of subflow placement, for the connections between two nodes: every
// subflow of every connection was seen in both directions on exactly one NIC of each node, the same NIC index on
// both, and the subflows of one connection use distinct NIC indexes. It returns every violation, joined.
func (a *Analysis) CheckPlacement(nodeA, nodeB int) error {
	var errs []error
	for _, c := range a.Connections {
		used := map[int]*Subflow{}
		for _, s := range c.Subflows {
			ka, okA := s.PlacedOn(nodeA)
			kb, okB := s.PlacedOn(nodeB)
			switch {
			case !okA || !okB:
				errs = append(errs, fmt.Errorf("connection %08x: subflow %v is not on exactly one NIC in both directions of nodes %d and %d", c.Token, s, nodeA, nodeB))
				continue
			case ka != kb:
				errs = append(errs, fmt.Errorf("connection %08x: subflow %v uses nic%d on node %d but nic%d on node %d", c.Token, s, ka, nodeA, kb, nodeB))
				continue
			}
			if other := used[ka]; other != nil {
				errs = append(errs, fmt.Errorf("connection %08x: subflows %v and %v share nic%d", c.Token, other, s, ka))
			}
			used[ka] = s
		}
	}
	return errors.Join(errs...)
}
