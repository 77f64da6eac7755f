package mptcpnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The path manager's events say what changed; sock_diag says what is. A
// path manager that starts after its pod's connections did (an agent that
// was restarted, events the kernel dropped) reads the subflows there are
// from the TCP sockets' MPTCP ULP info, as ss -tiM shows it
// (include/uapi/linux/inet_diag.h, mptcp.h).

// SubflowFlags are a subflow's MPTCP_SUBFLOW_FLAG_* bits.
type SubflowFlags uint32

// Subflow flags the agent reads.
const (
	// SubflowCapableLocal: this end sent the connection's MP_CAPABLE SYN
	// on this subflow (the connection's first, opened here).
	SubflowCapableLocal SubflowFlags = 1 << 1
	// SubflowJoinLocal: this end opened the subflow with an MP_JOIN.
	SubflowJoinLocal SubflowFlags = 1 << 3
	// SubflowBackupRemote: the peer asked this end to treat the subflow
	// as a backup (the B bit of the peer's MP_JOIN or its last MP_PRIO),
	// so this end sends on it only when no other subflow can.
	SubflowBackupRemote SubflowFlags = 1 << 4
	// SubflowBackupLocal: this end asks the peer to treat the subflow as a
	// backup (the B bit of its MP_JOIN or its last MP_PRIO).
	SubflowBackupLocal SubflowFlags = 1 << 5
	// SubflowFullyEstablished: the peer has answered the subflow's
	// handshake at the MPTCP level (for a join this end opened: the
	// acceptor's kernel acknowledged the third ACK), and this end may send
	// data on it.
	SubflowFullyEstablished SubflowFlags = 1 << 6
)

// Subflow is an established MPTCP subflow of a namespace.
type Subflow struct {
	Local, Remote netip.AddrPort
	// Token is the connection's token on this end: the one its path
	// manager events and commands carry.
	Token   uint32
	LocalID uint8
	Flags   SubflowFlags
	// Loss is the subflow's own loss recovery, from its tcp_info.
	Loss TCPLoss
	// Carried is what the subflow carried both ways, from its tcp_info:
	// the bytes it sent that the peer acknowledged and the bytes it
	// received (tcpi_bytes_acked + tcpi_bytes_received). CarriedKnown is
	// false where its tcp_info is too short to say (kernels before 4.19).
	Carried      uint64
	CarriedKnown bool
}

// TCPLoss is what a subflow's TCP says of its losses (struct tcp_info).
type TCPLoss struct {
	// CAState is tcpi_ca_state: 0 open, 1 disorder, 2 CWR, 3 recovery
	// (fast retransmit), 4 loss (a retransmission timeout fired).
	CAState uint8
	// Backoff is tcpi_backoff: how many times the retransmission timer
	// doubled since the last acknowledgement.
	Backoff uint8
	// Lost and Retrans are segments marked lost and segments sent again,
	// not yet acknowledged (tcpi_lost, tcpi_retrans).
	Lost, Retrans uint32
}

// The tcp_info states of TCPLoss.CAState that recover from losses.
const (
	caRecovery = 3 // TCP_CA_Recovery
	caLoss     = 4 // TCP_CA_Loss
)

// Recovering says whether the subflow is recovering from losses: segments
// lost or sent again and not yet acknowledged, or a fast-retransmit or
// timeout recovery under way. Data the connection waits for may then sit
// on it until its own timer fires. A backed-off timer alone is not a loss:
// zero-window probes back off too, and the receiver decides the window.
func (l TCPLoss) Recovering() bool {
	return l.Lost > 0 || l.Retrans > 0 || l.CAState == caRecovery || l.CAState == caLoss
}

// sock_diag constants the header packages do not all spell.
const (
	sockDiagByFamily = 20  // SOCK_DIAG_BY_FAMILY
	diagExtInfo      = 2   // INET_DIAG_INFO: asks for tcp_info and the ULP's; tcp_info's attribute
	diagULPInfo      = 19  // INET_DIAG_ULP_INFO
	ulpInfoName      = 1   // INET_ULP_INFO_NAME
	ulpInfoMPTCP     = 3   // INET_ULP_INFO_MPTCP
	subflowTokenLoc  = 2   // MPTCP_SUBFLOW_ATTR_TOKEN_LOC
	subflowFlags     = 8   // MPTCP_SUBFLOW_ATTR_FLAGS
	subflowIDLoc     = 10  // MPTCP_SUBFLOW_ATTR_ID_LOC
	diagReqLen       = 56  // struct inet_diag_req_v2
	diagMsgLen       = 72  // struct inet_diag_msg
	tcpInfoLossLen   = 40  // struct tcp_info up to tcpi_retrans
	tcpInfoBytesLen  = 136 // struct tcp_info up to tcpi_bytes_received
	tcpEstablished   = 1   // TCP_ESTABLISHED, a bit of idiag_states
)

// A pod's processes decide how many sockets its namespace has, so a listing
// is bounded: at most maxListedSockets TCP sockets, read within
// listTimeout, one datagram of at most receiveBuffer bytes at a time (never
// the whole dump in memory), on a socket connected to the kernel, so that
// no process of the namespace can answer in its place.
const (
	maxListedSockets = 1 << 16
	listTimeout      = 2 * time.Second
)

// ListSubflows lists the established MPTCP subflows of the network namespace
// with file descriptor netnsFD (0: the caller's), of both address families.
// TCP sockets that are not subflows are left out. A namespace with more than
// maxListedSockets established TCP sockets, or one whose listing takes longer
// than listTimeout, is an error.
func ListSubflows(netnsFD int) ([]Subflow, error) {
	l := NewLister(netnsFD)
	defer l.Close()
	return l.Subflows()
}

// A Lister lists one namespace's subflows and open TCP sockets, as
// ListSubflows and ListOpenTCPSockets do, over one sock_diag socket it
// keeps: opening a socket in another namespace costs a thread and a
// millisecond or more, which a path manager that reads its pod every few
// milliseconds should not pay each time. A listing that fails closes the
// socket (a dump may be left half read), and the next opens another. Safe
// for concurrent use: listings run one at a time.
type Lister struct {
	netnsFD int
	mu      sync.Mutex
	c       *netlink.Conn
}

// NewLister makes a Lister of the network namespace with file descriptor
// netnsFD, which must stay open while the Lister is used.
func NewLister(netnsFD int) *Lister { return &Lister{netnsFD: netnsFD} }

// Close closes the Lister's socket.
func (l *Lister) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		return nil
	}
	err := l.c.Close()
	l.c = nil
	return err
}

func (l *Lister) list(states uint32, ext uint8, each func(msg []byte) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		c, err := dialSockDiag(l.netnsFD)
		if err != nil {
			return err
		}
		l.c = c
	}
	err := listTCPOn(l.c, states, ext, maxListedSockets, each)
	if err != nil {
		_ = l.c.Close()
		l.c = nil
	}
	return err
}

// Subflows is ListSubflows on the Lister's namespace.
func (l *Lister) Subflows() ([]Subflow, error) {
	var out []Subflow
	err := l.list(1<<tcpEstablished, 1<<(diagExtInfo-1), func(msg []byte) error {
		sf, ok, err := decodeSubflow(msg)
		if ok {
			out = append(out, sf)
		}
		return err
	})
	return out, err
}

// Subflow looks up the TCP socket of one 4-tuple (local as the namespace
// sees it) and returns it as Subflows would list it; ok is false when there
// is none, or it is no established subflow. One request, not a listing: a
// listing walks the kernel's whole table of connections, a millisecond
// however few sockets the namespace holds.
func (l *Lister) Subflow(local, remote netip.AddrPort) (sf Subflow, ok bool, err error) {
	local, remote = netip.AddrPortFrom(local.Addr().Unmap(), local.Port()), netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	if local.Addr().Is4() != remote.Addr().Is4() {
		return sf, false, fmt.Errorf("%v -> %v mixes address families", local, remote)
	}
	family := uint8(unix.AF_INET6)
	if local.Addr().Is4() {
		family = unix.AF_INET
	}
	req := make([]byte, diagReqLen)
	req[0], req[1], req[2] = family, unix.IPPROTO_TCP, 1<<(diagExtInfo-1)
	binary.NativeEndian.PutUint32(req[4:8], 1<<tcpEstablished)
	// struct inet_diag_sockid: ports in network byte order, then the
	// addresses in 16 bytes each, the interface, and no cookie.
	binary.BigEndian.PutUint16(req[8:10], local.Port())
	binary.BigEndian.PutUint16(req[10:12], remote.Port())
	copy(req[12:28], local.Addr().AsSlice())
	copy(req[28:44], remote.Addr().AsSlice())
	binary.NativeEndian.PutUint32(req[48:52], ^uint32(0))
	binary.NativeEndian.PutUint32(req[52:56], ^uint32(0))

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		c, err := dialSockDiag(l.netnsFD)
		if err != nil {
			return sf, false, err
		}
		l.c = c
	}
	fail := func(err error) (Subflow, bool, error) {
		_ = l.c.Close()
		l.c = nil
		return Subflow{}, false, err
	}
	if err := l.c.SetReadDeadline(time.Now().Add(listTimeout)); err != nil {
		return fail(err)
	}
	sent, err := l.c.Send(netlink.Message{Header: netlink.Header{Type: sockDiagByFamily, Flags: netlink.Request}, Data: req})
	if err != nil {
		return fail(fmt.Errorf("looking a TCP socket up: %w", err))
	}
	found, done := false, false
	one := tcpListing{buf: make([]byte, receiveBuffer), limit: 1, each: func(msg []byte) error {
		var derr error
		sf, ok, derr = decodeSubflow(msg)
		found = true
		return derr
	}}
	for !found && !done {
		// The answer is one socket's message, or an error (ENOENT:
		// no such socket), and no NLMSG_DONE.
		if done, err = one.readOne(l.c, sent.Header.Sequence); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return Subflow{}, false, nil
			}
			return fail(fmt.Errorf("looking a TCP socket up: %w", err))
		}
	}
	return sf, ok, nil
}

// OpenTCPSockets is ListOpenTCPSockets on the Lister's namespace.
func (l *Lister) OpenTCPSockets() ([]SocketEnds, error) {
	var out []SocketEnds
	err := l.list(openStates, 0, func(msg []byte) error {
		local, remote, err := decodeEnds(msg)
		if err == nil {
			out = append(out, SocketEnds{Local: local, Remote: remote})
		}
		return err
	})
	return out, err
}

// SocketEnds are a TCP socket's two ends, as its namespace sees them.
type SocketEnds struct{ Local, Remote netip.AddrPort }

// openStates are the TCP states of a connected socket that can still
// receive a peer's packets: every state but TIME_WAIT (6), CLOSE (7) and
// LISTEN (10), as bits of idiag_states (TCPF_ALL is 0xfff). A listener is
// no subflow, and leaving listeners out keeps a pod with many of them from
// filling the bounded listing.
const openStates = 0xfff &^ (1<<6 | 1<<7 | 1<<10)

// ListOpenTCPSockets lists the connected TCP sockets of the network namespace
// with file descriptor netnsFD (0: the caller's) that can still receive a
// peer's packets (openStates), of both address families, bounded as ListSubflows
// is: more than maxListedSockets of them, or a listing that takes longer
// than listTimeout, is an error.
func ListOpenTCPSockets(netnsFD int) ([]SocketEnds, error) {
	l := NewLister(netnsFD)
	defer l.Close()
	return l.OpenTCPSockets()
}

// Listener is a TCP socket listening in a namespace.
type Listener struct {
	Local netip.AddrPort
	// MPTCP: the socket is an MPTCP listener's (it carries MPTCP's ULP),
	// taking MPTCP connections and falling back to TCP for the others.
	MPTCP bool
}

// tcpListen is TCP_LISTEN, a bit of idiag_states.
const tcpListen = 10

// ListListeners lists the listening TCP sockets of the network namespace
// with file descriptor netnsFD (0: the caller's), of both address
// families: more than limit of them, or a listing that takes longer than
// listTimeout, is an error. (The ULP's name comes with INET_DIAG_INFO
// only.)
func ListListeners(netnsFD, limit int) ([]Listener, error) {
	var out []Listener
	err := listTCP(netnsFD, 1<<tcpListen, 1<<(diagExtInfo-1), limit, func(msg []byte) error {
		local, _, err := decodeEnds(msg)
		if err != nil {
			return err
		}
		ulp, err := decodeULPName(msg)
		out = append(out, Listener{Local: local, MPTCP: ulp == "mptcp"})
		return err
	})
	return out, err
}

// decodeULPName reads the name of the upper layer protocol of one
// inet_diag_msg's socket ("mptcp" for an MPTCP listener's or subflow's),
// or "" for a socket without one. A listener carries the name alone: its
// MPTCP info (INET_ULP_INFO_MPTCP) is a subflow's.
func decodeULPName(b []byte) (string, error) {
	ad, err := netlink.NewAttributeDecoder(b[diagMsgLen:])
	if err != nil {
		return "", fmt.Errorf("sock_diag attributes: %w", err)
	}
	name := ""
	for ad.Next() {
		if ad.Type() != diagULPInfo {
			continue
		}
		ad.Nested(func(ulp *netlink.AttributeDecoder) error {
			for ulp.Next() {
				if ulp.Type() == ulpInfoName {
					name = ulp.String()
				}
			}
			return ulp.Err()
		})
	}
	if err := ad.Err(); err != nil {
		return "", fmt.Errorf("sock_diag ULP info: %w", err)
	}
	return name, nil
}

// listTCP dumps the TCP sockets of the network namespace with file
// descriptor netnsFD in states (a bit per TCP state), of both address
// families, asking for the inet_diag extensions ext, and hands each
// socket's inet_diag_msg to each. More than limit sockets, a listing that
// takes longer than listTimeout, an error of the kernel's or of each end
// it.
func listTCP(netnsFD int, states uint32, ext uint8, limit int, each func(msg []byte) error) error {
	c, err := dialSockDiag(netnsFD)
	if err != nil {
		return err
	}
	defer c.Close()
	return listTCPOn(c, states, ext, limit, each)
}

// listTCPOn is listTCP on the sock_diag socket c.
func listTCPOn(c *netlink.Conn, states uint32, ext uint8, limit int, each func(msg []byte) error) error {
	if err := c.SetReadDeadline(time.Now().Add(listTimeout)); err != nil {
		return err
	}
	l := tcpListing{buf: make([]byte, receiveBuffer), limit: limit, each: each}
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		req := make([]byte, diagReqLen)
		req[0], req[1], req[2] = family, unix.IPPROTO_TCP, ext
		binary.NativeEndian.PutUint32(req[4:8], states)
		sent, err := c.Send(netlink.Message{
			Header: netlink.Header{Type: sockDiagByFamily, Flags: netlink.Request | netlink.Dump},
			Data:   req,
		})
		if err != nil {
			return fmt.Errorf("listing TCP sockets: %w", err)
		}
		if err := l.read(c, sent.Header.Sequence); err != nil {
			return fmt.Errorf("listing TCP sockets: %w", err)
		}
	}
	return nil
}

// dialSockDiag opens a sock_diag socket in the network namespace with file
// descriptor netnsFD, connected to the kernel: only the kernel may answer,
// a process of the namespace could send to the socket otherwise.
func dialSockDiag(netnsFD int) (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_SOCK_DIAG, &netlink.Config{NetNS: netnsFD})
	if err != nil {
		return nil, fmt.Errorf("sock_diag: %w", err)
	}
	if err := connectToKernel(c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// tcpListing reads the replies of one dump after the other.
type tcpListing struct {
	buf     []byte
	sockets int
	limit   int
	each    func(msg []byte) error
}

// readOne reads one datagram of replies to the request seq; done says it
// held the last.
func (l *tcpListing) readOne(c *netlink.Conn, seq uint32) (done bool, err error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return false, err
	}
	var n int
	var rerr error
	if err := raw.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), l.buf, unix.MSG_DONTWAIT)
		return rerr != unix.EAGAIN && rerr != unix.EWOULDBLOCK
	}); err != nil {
		return false, err
	}
	if rerr != nil {
		return false, rerr
	}
	return l.datagram(l.buf[:n], seq)
}

// read reads the replies to the dump request seq until its end.
func (l *tcpListing) read(c *netlink.Conn, seq uint32) error {
	for {
		done, err := l.readOne(c, seq)
		if done || err != nil {
			return err
		}
	}
}

// datagram decodes one datagram of replies to seq; done says the dump ended.
func (l *tcpListing) datagram(b []byte, seq uint32) (done bool, err error) {
	for len(b) >= unix.NLMSG_HDRLEN {
		size := int(binary.NativeEndian.Uint32(b[0:4]))
		if size < unix.NLMSG_HDRLEN || size > len(b) {
			return false, fmt.Errorf("a netlink message of %d bytes in %d", size, len(b))
		}
		typ, flags, got := binary.NativeEndian.Uint16(b[4:6]), binary.NativeEndian.Uint16(b[6:8]), binary.NativeEndian.Uint32(b[8:12])
		data := b[unix.NLMSG_HDRLEN:size]
		b = b[min((size+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1), len(b)):]
		if got != seq {
			continue // a late reply to an earlier request
		}
		if flags&unix.NLM_F_DUMP_INTR != 0 {
			// A listing that may lack sockets would have a sweep take
			// an open one for closed.
			return false, errors.New("the listing was interrupted by a change")
		}
		switch typ {
		case unix.NLMSG_DONE:
			return true, nil
		case unix.NLMSG_ERROR:
			if len(data) >= 4 && int32(binary.NativeEndian.Uint32(data)) != 0 {
				return false, unix.Errno(-int32(binary.NativeEndian.Uint32(data)))
			}
			return true, nil
		case sockDiagByFamily:
			if l.sockets++; l.sockets > l.limit {
				return false, fmt.Errorf("more than %d TCP sockets", l.limit)
			}
			if err := l.each(data); err != nil {
				return false, err
			}
		}
	}
	return false, nil
}

// decodeEnds decodes the two ends of one inet_diag_msg.
func decodeEnds(b []byte) (local, remote netip.AddrPort, err error) {
	if len(b) < diagMsgLen {
		return local, remote, fmt.Errorf("sock_diag: a message of %d bytes", len(b))
	}
	family := b[0]
	addr := func(raw []byte) netip.Addr {
		if family == unix.AF_INET {
			return netip.AddrFrom4([4]byte(raw[:4]))
		}
		return netip.AddrFrom16([16]byte(raw[:16])).Unmap()
	}
	// struct inet_diag_sockid starts at 4: ports in network byte order,
	// then source and destination in 16 bytes each.
	local = netip.AddrPortFrom(addr(b[8:24]), binary.BigEndian.Uint16(b[4:6]))
	remote = netip.AddrPortFrom(addr(b[24:40]), binary.BigEndian.Uint16(b[6:8]))
	return local, remote, nil
}

// decodeSubflow decodes one inet_diag_msg; ok is false for a TCP socket
// that is not an MPTCP subflow.
func decodeSubflow(b []byte) (sf Subflow, ok bool, err error) {
	if sf.Local, sf.Remote, err = decodeEnds(b); err != nil {
		return sf, false, err
	}
	ad, err := netlink.NewAttributeDecoder(b[diagMsgLen:])
	if err != nil {
		return sf, false, fmt.Errorf("sock_diag attributes: %w", err)
	}
	for ad.Next() {
		switch ad.Type() {
		case diagExtInfo:
			sf.Loss = decodeTCPLoss(ad.Bytes())
			sf.Carried, sf.CarriedKnown = decodeCarried(ad.Bytes())
			continue
		case diagULPInfo:
		default:
			continue
		}
		ad.Nested(func(ulp *netlink.AttributeDecoder) error {
			for ulp.Next() {
				if ulp.Type() != ulpInfoMPTCP {
					continue
				}
				ok = true
				ulp.Nested(func(mp *netlink.AttributeDecoder) error {
					for mp.Next() {
						switch mp.Type() {
						case subflowTokenLoc:
							sf.Token = mp.Uint32()
						case subflowFlags:
							sf.Flags = SubflowFlags(mp.Uint32())
						case subflowIDLoc:
							sf.LocalID = mp.Uint8()
						}
					}
					return mp.Err()
				})
			}
			return ulp.Err()
		})
	}
	if err := ad.Err(); err != nil {
		return sf, false, fmt.Errorf("sock_diag MPTCP info: %w", err)
	}
	return sf, ok, nil
}

// decodeTCPLoss reads a subflow's losses from its struct tcp_info
// (include/uapi/linux/tcp.h); a shorter one says nothing.
func decodeTCPLoss(info []byte) TCPLoss {
	if len(info) < tcpInfoLossLen {
		return TCPLoss{}
	}
	return TCPLoss{CAState: info[1], Backoff: info[4],
		Lost: binary.NativeEndian.Uint32(info[32:36]), Retrans: binary.NativeEndian.Uint32(info[36:40])}
}

// decodeCarried reads what a subflow carried both ways from its struct
// tcp_info: tcpi_bytes_acked (offset 120) and tcpi_bytes_received (128); a
// shorter one says nothing (ok false).
func decodeCarried(info []byte) (carried uint64, ok bool) {
	if len(info) < tcpInfoBytesLen {
		return 0, false
	}
	return binary.NativeEndian.Uint64(info[120:128]) + binary.NativeEndian.Uint64(info[128:136]), true
}
