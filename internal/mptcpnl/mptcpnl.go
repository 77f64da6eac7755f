// Package mptcpnl speaks the kernel's MPTCP path-manager generic netlink
// family ("mptcp_pm", include/uapi/linux/mptcp_pm.h): limits, endpoints,
// subflow creation for a userspace path manager, and the event stream that
// tells it when connections are established. A Conn is bound to the network
// namespace it was opened in, so the agent holds one per pod.
package mptcpnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

const (
	familyName     = "mptcp_pm"
	eventGroupName = "mptcp_pm_events"
)

// Commands (enum mptcp_pm_command).
const (
	cmdAddAddr        = 1
	cmdDelAddr        = 2
	cmdGetAddr        = 3
	cmdFlushAddrs     = 4
	cmdSetLimits      = 5
	cmdGetLimits      = 6
	cmdSetFlags       = 7
	cmdSubflowCreate  = 10
	cmdSubflowDestroy = 11
)

// Top-level attributes (enum mptcp_pm_attrs).
const (
	attrAddr        = 1
	attrRcvAddAddrs = 2
	attrSubflows    = 3
	attrToken       = 4
	attrAddrRemote  = 6
)

// Address attributes (enum mptcp_pm_addr_attrs).
const (
	addrAttrFamily = 1
	addrAttrID     = 2
	addrAttrAddr4  = 3
	addrAttrAddr6  = 4
	addrAttrPort   = 5 // host byte order
	addrAttrFlags  = 6
	addrAttrIfIdx  = 7
)

// Endpoint flags (MPTCP_PM_ADDR_FLAG_*).
const (
	FlagSignal  = 1 << 0
	FlagSubflow = 1 << 1
	FlagBackup  = 1 << 2
	// FlagFullmesh makes the path manager open a subflow from this
	// endpoint to every address the peer announced.
	FlagFullmesh = 1 << 3
	// FlagImplicit marks an endpoint the kernel made itself, for a
	// local address its subflows use that no endpoint named.
	FlagImplicit = 1 << 4
)

// EventType is enum mptcp_event_type.
type EventType uint8

// Event types the agent acts on.
const (
	EventCreated        EventType = 1
	EventEstablished    EventType = 2
	EventClosed         EventType = 3
	EventSubEstablished EventType = 10
	EventSubClosed      EventType = 11
)

// Event attributes (enum mptcp_event_attr).
const (
	evAttrToken      = 1
	evAttrFamily     = 2
	evAttrLocID      = 3
	evAttrRemID      = 4
	evAttrSaddr4     = 5
	evAttrSaddr6     = 6
	evAttrDaddr4     = 7
	evAttrDaddr6     = 8
	evAttrSport      = 9  // network byte order
	evAttrDport      = 10 // network byte order
	evAttrBackup     = 11
	evAttrError      = 12
	evAttrServerSide = 18
)

// Conn is a generic netlink connection to one namespace's MPTCP path manager.
type Conn struct {
	c      *genetlink.Conn
	family genetlink.Family
	// buf receives events (Receive); nil until the first.
	buf []byte
}

// Dial opens a connection in the network namespace with file descriptor
// netnsFD (0: the caller's namespace).
func Dial(netnsFD int) (*Conn, error) {
	c, err := genetlink.Dial(&netlink.Config{NetNS: netnsFD})
	if err != nil {
		return nil, fmt.Errorf("generic netlink: %w", err)
	}
	if err := connectToKernel(c); err != nil {
		c.Close()
		return nil, err
	}
	f, err := c.GetFamily(familyName)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("MPTCP path manager family %q: %w (is MPTCP enabled in this kernel?)", familyName, err)
	}
	return &Conn{c: c, family: f}, nil
}

// connectToKernel connects the socket to the kernel (port id 0). Any process
// of a namespace, without a capability, may send unicast to any netlink
// socket of it; the kernel refuses (ECONNREFUSED) unicast to a connected
// socket from any port but the one it is connected to. Replies to requests
// and multicast events still arrive.
func connectToKernel(c interface {
	SyscallConn() (syscall.RawConn, error)
}) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cerr = unix.Connect(int(fd), &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("connecting the netlink socket to the kernel: %w", cerr)
	}
	return nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

func (c *Conn) do(cmd uint8, flags netlink.HeaderFlags, encode func(*netlink.AttributeEncoder)) ([]genetlink.Message, error) {
	ae := netlink.NewAttributeEncoder()
	if encode != nil {
		encode(ae)
	}
	data, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	msg := genetlink.Message{Header: genetlink.Header{Command: cmd, Version: c.family.Version}, Data: data}
	return c.c.Execute(msg, c.family.ID, netlink.Request|flags)
}

// Limits are the per-namespace MPTCP limits.
type Limits struct {
	Subflows        uint32 // extra subflows per connection
	AddAddrAccepted uint32 // ADD_ADDRs accepted per connection
}

// SetLimits sets the namespace's limits.
func (c *Conn) SetLimits(l Limits) error {
	_, err := c.do(cmdSetLimits, netlink.Acknowledge, func(ae *netlink.AttributeEncoder) {
		ae.Uint32(attrRcvAddAddrs, l.AddAddrAccepted)
		ae.Uint32(attrSubflows, l.Subflows)
	})
	return err
}

// GetLimits reads the namespace's limits.
func (c *Conn) GetLimits() (Limits, error) {
	msgs, err := c.do(cmdGetLimits, 0, nil)
	if err != nil {
		return Limits{}, err
	}
	var l Limits
	for _, m := range msgs {
		ad, err := netlink.NewAttributeDecoder(m.Data)
		if err != nil {
			return l, err
		}
		for ad.Next() {
			switch ad.Type() {
			case attrRcvAddAddrs:
				l.AddAddrAccepted = ad.Uint32()
			case attrSubflows:
				l.Subflows = ad.Uint32()
			}
		}
		if err := ad.Err(); err != nil {
			return l, err
		}
	}
	return l, nil
}

// Endpoint is a local address the in-kernel path manager may use.
type Endpoint struct {
	Addr  netip.Addr `json:"addr"`
	ID    uint8      `json:"id"`
	Port  uint16     `json:"port,omitempty"`
	Flags uint32     `json:"flags,omitempty"`
	// IfIndex ties the endpoint to an interface (ip mptcp endpoint ...
	// dev); 0: none.
	IfIndex int32 `json:"ifIndex,omitempty"`
}

// AddEndpoint adds an endpoint to the in-kernel path manager.
func (c *Conn) AddEndpoint(e Endpoint) error {
	_, err := c.do(cmdAddAddr, netlink.Acknowledge, func(ae *netlink.AttributeEncoder) {
		ae.Nested(attrAddr, func(nae *netlink.AttributeEncoder) error {
			encodeAddr(nae, e.Addr, e.ID, e.Port)
			nae.Uint32(addrAttrFlags, e.Flags)
			if e.IfIndex != 0 {
				nae.Int32(addrAttrIfIdx, e.IfIndex)
			}
			return nil
		})
	})
	return err
}

// Endpoints lists the namespace's endpoints (ip mptcp endpoint show).
func (c *Conn) Endpoints() ([]Endpoint, error) {
	msgs, err := c.do(cmdGetAddr, netlink.Dump, nil)
	if err != nil {
		return nil, err
	}
	var out []Endpoint
	for _, m := range msgs {
		ad, err := netlink.NewAttributeDecoder(m.Data)
		if err != nil {
			return out, err
		}
		for ad.Next() {
			if ad.Type() != attrAddr {
				continue
			}
			var e Endpoint
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					switch nad.Type() {
					case addrAttrID:
						e.ID = nad.Uint8()
					case addrAttrAddr4, addrAttrAddr6:
						e.Addr, _ = netip.AddrFromSlice(nad.Bytes())
					case addrAttrPort:
						e.Port = nad.Uint16()
					case addrAttrFlags:
						e.Flags = nad.Uint32()
					case addrAttrIfIdx:
						e.IfIndex = nad.Int32()
					}
				}
				return nil
			})
			out = append(out, e)
		}
		if err := ad.Err(); err != nil {
			return out, err
		}
	}
	return out, nil
}

// DeleteEndpoint removes the namespace's endpoint with id (not 0). The
// kernel withdraws it from the connections it was announced to (RM_ADDR)
// and closes the subflows it made from it.
func (c *Conn) DeleteEndpoint(id uint8) error {
	if id == 0 {
		return errors.New("deleting endpoint id 0: the id of a connection's first subflow")
	}
	_, err := c.do(cmdDelAddr, netlink.Acknowledge, func(ae *netlink.AttributeEncoder) {
		ae.Nested(attrAddr, func(nae *netlink.AttributeEncoder) error {
			nae.Uint8(addrAttrID, id)
			return nil
		})
	})
	return err
}

// FlushEndpoints removes every endpoint of the namespace.
func (c *Conn) FlushEndpoints() error {
	_, err := c.do(cmdFlushAddrs, netlink.Acknowledge, nil)
	return err
}

func encodeAddr(ae *netlink.AttributeEncoder, addr netip.Addr, id uint8, port uint16) {
	addr = addr.Unmap()
	if addr.Is4() {
		ae.Uint16(addrAttrFamily, 2)
		a := addr.As4()
		ae.Bytes(addrAttrAddr4, a[:])
	} else {
		ae.Uint16(addrAttrFamily, 10)
		a := addr.As16()
		ae.Bytes(addrAttrAddr6, a[:])
	}
	ae.Uint8(addrAttrID, id)
	if port != 0 {
		ae.Uint16(addrAttrPort, port)
	}
}

// CreateSubflow asks a userspace-managed connection (by token) to open a
// join from local (with its address id) to remote. The kernel picks the
// source port. flags are the local address's endpoint flags: FlagBackup
// opens the join as a backup subflow (the B bit of its MP_JOIN), which
// neither end sends data on while the connection has an active subflow.
func (c *Conn) CreateSubflow(token uint32, local netip.Addr, localID uint8, remote netip.AddrPort, flags uint32) error {
	_, err := c.do(cmdSubflowCreate, netlink.Acknowledge, encodeSubflow(token, local, localID, 0, flags, remote))
	return err
}

// DestroySubflow closes one subflow of a userspace-managed connection (by
// token), named by both ends' addresses and ports. The kernel shuts the
// subflow down, reports it closed (EventSubClosed), and sends again at
// once, over the connection's other subflows, all the data the peer has not
// acknowledged at the connection level: what the closed subflow still held
// is not left to its own retransmission timer.
func (c *Conn) DestroySubflow(token uint32, local, remote netip.AddrPort) error {
	_, err := c.do(cmdSubflowDestroy, netlink.Acknowledge, encodeSubflow(token, local.Addr(), 0, local.Port(), 0, remote))
	return err
}

// SetSubflowBackup makes one subflow of a userspace-managed connection (by
// token), named by both ends' addresses and ports, a backup subflow or an
// active one: the kernel sends an MP_PRIO on it, and its own scheduler
// follows. Without the ports every subflow between the two addresses would
// match.
func (c *Conn) SetSubflowBackup(token uint32, local, remote netip.AddrPort, backup bool) error {
	var flags uint32
	if backup {
		flags = FlagBackup
	}
	_, err := c.do(cmdSetFlags, netlink.Acknowledge, encodeSubflow(token, local.Addr(), 0, local.Port(), flags, remote))
	return err
}

// encodeSubflow encodes the attributes naming a subflow of the connection
// token: its local address (id, port when known, endpoint flags) and its
// remote address and port.
func encodeSubflow(token uint32, local netip.Addr, localID uint8, localPort uint16, flags uint32, remote netip.AddrPort) func(*netlink.AttributeEncoder) {
	return func(ae *netlink.AttributeEncoder) {
		ae.Uint32(attrToken, token)
		ae.Nested(attrAddr, func(nae *netlink.AttributeEncoder) error {
			encodeAddr(nae, local, localID, localPort)
			nae.Uint32(addrAttrFlags, flags)
			return nil
		})
		ae.Nested(attrAddrRemote, func(nae *netlink.AttributeEncoder) error {
			encodeAddr(nae, remote.Addr(), 0, remote.Port())
			return nil
		})
	}
}

// Event is one MPTCP path-manager event.
type Event struct {
	Type       EventType
	Token      uint32
	Local      netip.AddrPort
	Remote     netip.AddrPort
	LocalID    uint8
	RemoteID   uint8
	Backup     bool
	ServerSide bool
	Error      uint8
}

// SubscribeEvents joins the event multicast group; Receive then returns events.
func (c *Conn) SubscribeEvents() error {
	for _, g := range c.family.Groups {
		if g.Name == eventGroupName {
			return c.c.JoinGroup(g.ID)
		}
	}
	return errors.New("MPTCP path manager has no event group")
}

// ErrMalformed marks a message Receive could not decode, or one that did
// not come from the kernel. The socket is still usable: whoever reads
// events skips the message and goes on.
var ErrMalformed = errors.New("malformed MPTCP event")

// receiveBuffer holds one datagram: the kernel's events are far smaller.
const receiveBuffer = 64 << 10

// Receive blocks until events arrive. A message that cannot be decoded, or
// that another socket sent (a process of the namespace with CAP_NET_ADMIN
// may multicast to the event group), is left out and reported as
// ErrMalformed alongside the batch's other events: one bad message must not
// cost the events around it, nor end the socket. Any other error is the
// socket's.
//
// Receive reads the socket itself, not through genetlink: the library
// neither says which port a datagram came from nor tells a message it
// cannot decode from a failing socket.
func (c *Conn) Receive() ([]Event, error) {
	if c.buf == nil {
		c.buf = make([]byte, receiveBuffer)
	}
	raw, err := c.c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var n, flags int
	var from unix.Sockaddr
	var rerr error
	err = raw.Read(func(fd uintptr) bool {
		n, _, flags, from, rerr = unix.Recvmsg(int(fd), c.buf, nil, unix.MSG_DONTWAIT)
		return rerr != unix.EAGAIN && rerr != unix.EWOULDBLOCK
	})
	if err != nil {
		return nil, err
	}
	if rerr != nil {
		return nil, fmt.Errorf("recvmsg: %w", rerr)
	}
	if flags&unix.MSG_TRUNC != 0 {
		return nil, fmt.Errorf("%w: a datagram longer than %d bytes", ErrMalformed, len(c.buf))
	}
	if nl, ok := from.(*unix.SockaddrNetlink); !ok || nl.Pid != 0 {
		return nil, fmt.Errorf("%w: sent by netlink port %v, not the kernel", ErrMalformed, from)
	}
	return c.decodeDatagram(c.buf[:n])
}

// decodeDatagram decodes the events of one datagram; what does not decode
// is reported as ErrMalformed.
func (c *Conn) decodeDatagram(b []byte) ([]Event, error) {
	var out []Event
	var errs []error
	for len(b) > 0 {
		if len(b) < unix.NLMSG_HDRLEN {
			errs = append(errs, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(b)))
			break
		}
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			errs = append(errs, fmt.Errorf("%w: netlink message of length %d in %d bytes", ErrMalformed, l, len(b)))
			break
		}
		typ := binary.NativeEndian.Uint16(b[4:6])
		data := b[unix.NLMSG_HDRLEN:l]
		b = b[min((l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1), len(b)):]
		if typ != c.family.ID {
			errs = append(errs, fmt.Errorf("%w: netlink message type %d, not the MPTCP family's %d", ErrMalformed, typ, c.family.ID))
			continue
		}
		var m genetlink.Message
		if err := m.UnmarshalBinary(data); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrMalformed, err))
			continue
		}
		ev, err := decodeEvent(m)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrMalformed, err))
			continue
		}
		out = append(out, ev)
	}
	return out, errors.Join(errs...)
}

func decodeEvent(m genetlink.Message) (Event, error) {
	ev := Event{Type: EventType(m.Header.Command)}
	ad, err := netlink.NewAttributeDecoder(m.Data)
	if err != nil {
		return ev, err
	}
	var saddr, daddr netip.Addr
	var sport, dport uint16
	// The kernel's attributes have fixed lengths; anything else (a buggy
	// or hostile sender on the same netlink family) is an error, never an
	// index out of range.
	addr := func(want int, into *netip.Addr) {
		b := ad.Bytes()
		if len(b) != want {
			ad.Do(func([]byte) error { return fmt.Errorf("attribute %d: %d bytes, want %d", ad.Type(), len(b), want) })
			return
		}
		*into, _ = netip.AddrFromSlice(b)
	}
	// Ports come in network byte order, unlike the other numbers.
	port := func(into *uint16) {
		b := ad.Bytes()
		if len(b) != 2 {
			ad.Do(func([]byte) error { return fmt.Errorf("attribute %d: %d bytes, want 2", ad.Type(), len(b)) })
			return
		}
		*into = binary.BigEndian.Uint16(b)
	}
	for ad.Next() {
		switch ad.Type() {
		case evAttrToken:
			ev.Token = ad.Uint32()
		case evAttrLocID:
			ev.LocalID = ad.Uint8()
		case evAttrRemID:
			ev.RemoteID = ad.Uint8()
		case evAttrSaddr4:
			addr(4, &saddr)
		case evAttrSaddr6:
			addr(16, &saddr)
		case evAttrDaddr4:
			addr(4, &daddr)
		case evAttrDaddr6:
			addr(16, &daddr)
		case evAttrSport:
			port(&sport)
		case evAttrDport:
			port(&dport)
		case evAttrBackup:
			ev.Backup = ad.Uint8() != 0
		case evAttrError:
			ev.Error = ad.Uint8()
		case evAttrServerSide:
			ev.ServerSide = ad.Uint8() != 0
		}
	}
	ev.Local = netip.AddrPortFrom(saddr, sport)
	ev.Remote = netip.AddrPortFrom(daddr, dport)
	return ev, ad.Err()
}

// PortID is the socket's netlink port id (nl_pid), to which the kernel
// sends it unicast replies.
func (c *Conn) PortID() (uint32, error) {
	raw, err := c.c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var sa unix.Sockaddr
	var serr error
	if err := raw.Control(func(fd uintptr) { sa, serr = unix.Getsockname(int(fd)) }); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, fmt.Errorf("getsockname: %w", serr)
	}
	nl, ok := sa.(*unix.SockaddrNetlink)
	if !ok {
		return 0, fmt.Errorf("getsockname: %T, not a netlink address", sa)
	}
	return nl.Pid, nil
}

// SyscallConn is the socket, for options and inspection; reading or
// writing it behind the Conn's back breaks the Conn.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.c.SyscallConn() }
