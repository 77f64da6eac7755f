// Package testpkt builds Ethernet frames carrying TCP and MPTCP options for
// tests of the datapath. Frames are built in plain sight, field by field, with
// correct checksums, so a test states exactly what goes on the wire.
package testpkt

import (
	"encoding/binary"
	"net/netip"
)

// TCP flag bits.
const (
	FIN = 0x01
	SYN = 0x02
	RST = 0x04
	PSH = 0x08
	ACK = 0x10
)

// TCP is a TCP header and its payload.
type TCP struct {
	SrcPort, DstPort uint16
	Seq, Ack         uint32
	Flags            uint8
	Window           uint16
	Options          []byte // raw option bytes, padded with EOL to a multiple of 4
	Payload          []byte
}

// Frame is an Ethernet frame with an IP packet.
type Frame struct {
	VLANs    []uint16 // 802.1Q tags, outermost first
	Src, Dst netip.Addr
	// Protocol is the IP protocol when TCP is nil (e.g. 17 for UDP); its
	// payload is Payload.
	Protocol uint8
	Payload  []byte
	TCP      *TCP
	// IPv4Options are raw IPv4 options (padded to 4 bytes by the builder).
	IPv4Options []byte
	// IPv6HopByHop adds a hop-by-hop extension header of 8 bytes.
	IPv6HopByHop bool
	// IPv6DestOpts adds destination-options headers of 8 bytes each, after
	// the hop-by-hop header.
	IPv6DestOpts int
}

// Bytes encodes the frame.
func (f Frame) Bytes() []byte {
	var l4 []byte
	proto := f.Protocol
	if f.TCP != nil {
		proto = 6
		l4 = f.TCP.encode(f.Src, f.Dst)
	} else {
		l4 = f.Payload
	}

	var l3 []byte
	var ethType uint16
	if f.Src.Is4() {
		ethType = 0x0800
		l3 = ipv4(f.Src, f.Dst, proto, pad4(f.IPv4Options), l4)
	} else {
		ethType = 0x86dd
		l3 = ipv6(f.Src, f.Dst, proto, f.IPv6HopByHop, f.IPv6DestOpts, l4)
	}

	b := make([]byte, 0, 14+4*len(f.VLANs)+len(l3))
	b = append(b, 0x02, 0, 0, 0, 0, 0x02) // dst MAC
	b = append(b, 0x02, 0, 0, 0, 0, 0x01) // src MAC
	for _, tag := range f.VLANs {
		b = binary.BigEndian.AppendUint16(b, 0x8100)
		b = binary.BigEndian.AppendUint16(b, tag)
	}
	b = binary.BigEndian.AppendUint16(b, ethType)
	return append(b, l3...)
}

func pad4(opts []byte) []byte {
	for len(opts)%4 != 0 {
		opts = append(opts, 0) // EOL
	}
	return opts
}

func ipv4(src, dst netip.Addr, proto uint8, opts, payload []byte) []byte {
	hlen := 20 + len(opts)
	h := make([]byte, hlen, hlen+len(payload))
	h[0] = 0x40 | byte(hlen/4)
	binary.BigEndian.PutUint16(h[2:], uint16(hlen+len(payload)))
	binary.BigEndian.PutUint16(h[4:], 0x1234)
	h[6] = 0x40 // DF
	h[8] = 64
	h[9] = proto
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	copy(h[20:], opts)
	binary.BigEndian.PutUint16(h[10:], ^fold(sum(0, h)))
	return append(h, payload...)
}

func ipv6(src, dst netip.Addr, proto uint8, hopByHop bool, destOpts int, payload []byte) []byte {
	next := proto
	var ext []byte
	// Built from the inside out: each header of 8 bytes holds the next
	// header's number, length 0 and a PadN option.
	for range destOpts {
		ext = append([]byte{next, 0, 1, 4, 0, 0, 0, 0}, ext...)
		next = 60
	}
	if hopByHop {
		ext = append([]byte{next, 0, 1, 4, 0, 0, 0, 0}, ext...)
		next = 0
	}
	h := make([]byte, 40, 40+len(ext)+len(payload))
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(ext)+len(payload)))
	h[6] = next
	h[7] = 64
	s, d := src.As16(), dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	h = append(h, ext...)
	return append(h, payload...)
}

func (t *TCP) encode(src, dst netip.Addr) []byte {
	opts := pad4(append([]byte(nil), t.Options...))
	if len(opts) > 40 {
		// The data offset has 4 bits: a test asking for more is wrong.
		panic("testpkt: more than 40 bytes of TCP options")
	}
	hlen := 20 + len(opts)
	b := make([]byte, hlen, hlen+len(t.Payload))
	binary.BigEndian.PutUint16(b[0:], t.SrcPort)
	binary.BigEndian.PutUint16(b[2:], t.DstPort)
	binary.BigEndian.PutUint32(b[4:], t.Seq)
	binary.BigEndian.PutUint32(b[8:], t.Ack)
	b[12] = byte(hlen/4) << 4
	b[13] = t.Flags
	w := t.Window
	if w == 0 {
		w = 65535
	}
	binary.BigEndian.PutUint16(b[14:], w)
	copy(b[20:], opts)
	b = append(b, t.Payload...)
	binary.BigEndian.PutUint16(b[16:], ^fold(sum(pseudoHeader(src, dst, 6, len(b)), b)))
	return b
}

func pseudoHeader(src, dst netip.Addr, proto uint8, length int) uint32 {
	var s uint32
	s = sum(s, src.AsSlice())
	s = sum(s, dst.AsSlice())
	s += uint32(proto)
	s += uint32(length)
	return s
}

func sum(s uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// MPTCP options (RFC 8684 section 3).

// MPCapableSYN is MP_CAPABLE v1 on a SYN: no key (section 3.1).
func MPCapableSYN() []byte { return []byte{30, 4, 0x01, 0x81} }

// MPCapableSYNACK is MP_CAPABLE v1 on a SYN-ACK with the sender's key.
func MPCapableSYNACK(key uint64) []byte {
	b := []byte{30, 12, 0x01, 0x01}
	return binary.BigEndian.AppendUint64(b, key)
}

// MPCapableACK is MP_CAPABLE v1 on the third ACK with both keys.
func MPCapableACK(senderKey, receiverKey uint64) []byte {
	b := []byte{30, 20, 0x01, 0x01}
	b = binary.BigEndian.AppendUint64(b, senderKey)
	return binary.BigEndian.AppendUint64(b, receiverKey)
}

// MPJoinSYN is MP_JOIN on a SYN with the receiver's token (section 3.2).
func MPJoinSYN(token, nonce uint32, addrID uint8, backup bool) []byte {
	flags := byte(0x10)
	if backup {
		flags |= 1
	}
	b := []byte{KindMPTCP, 12, flags, addrID}
	b = binary.BigEndian.AppendUint32(b, token)
	return binary.BigEndian.AppendUint32(b, nonce)
}

// MPTCP option kind and the subtype numbers (RFC 8684 section 3), placed in
// the high nibble of the option's third byte.
const (
	KindMPTCP       = 30
	SubCapable      = 0x0
	SubJoin         = 0x1
	SubDSS          = 0x2
	SubAddAddr      = 0x3
	SubRemoveAddr   = 0x4
	SubPrio         = 0x5
	SubFail         = 0x6
	SubFastclose    = 0x7
	SubTCPRst       = 0x8
	SubExperimental = 0xf
)

// MPCapableACKData is MP_CAPABLE v1 on the first data segment (section 3.1):
// both keys and the data-level length, length 22, or 24 with a checksum
// when checksums were negotiated.
func MPCapableACKData(senderKey, receiverKey uint64, dataLen uint16, checksum *uint16) []byte {
	b := MPCapableACK(senderKey, receiverKey)
	b = binary.BigEndian.AppendUint16(b, dataLen)
	if checksum != nil {
		b[3] |= 0x80 // A: checksums required, as negotiated
		b = binary.BigEndian.AppendUint16(b, *checksum)
	}
	b[1] = byte(len(b))
	return b
}

// MPJoinSYNACK is MP_JOIN on a SYN-ACK (section 3.2, figure 6): the
// truncated HMAC and the sender's nonce, length 16.
func MPJoinSYNACK(truncatedHMAC uint64, nonce uint32, addrID uint8, backup bool) []byte {
	flags := byte(SubJoin << 4)
	if backup {
		flags |= 1
	}
	b := []byte{KindMPTCP, 16, flags, addrID}
	b = binary.BigEndian.AppendUint64(b, truncatedHMAC)
	return binary.BigEndian.AppendUint32(b, nonce)
}

// MPJoinACK is MP_JOIN on the third ACK (section 3.2, figure 7): the full
// 160-bit HMAC, length 24.
func MPJoinACK(hmac [20]byte) []byte {
	return append([]byte{KindMPTCP, 24, SubJoin << 4, 0}, hmac[:]...)
}

// DSS is a Data Sequence Signal option (section 3.3, figure 9). Nil fields
// are absent.
type DSS struct {
	DataACK  *uint64 // Data ACK (flag A)
	DataACK8 bool    // send it in 8 octets (flag a)
	// Mapping (flag M): data sequence number, subflow sequence number and
	// data-level length, and the checksum when one was negotiated.
	Mapping *DSSMapping
	DataFIN bool // flag F
}

// DSSMapping is the mapping part of a DSS option.
type DSSMapping struct {
	DSN      uint64
	DSN8     bool // send the DSN in 8 octets (flag m)
	SSN      uint32
	Length   uint16
	Checksum *uint16
}

// Bytes encodes the option.
func (d DSS) Bytes() []byte {
	var flags byte
	b := []byte{KindMPTCP, 0, SubDSS << 4, 0}
	if d.DataACK != nil {
		flags |= 0x01
		if d.DataACK8 {
			flags |= 0x02
			b = binary.BigEndian.AppendUint64(b, *d.DataACK)
		} else {
			b = binary.BigEndian.AppendUint32(b, uint32(*d.DataACK))
		}
	}
	if m := d.Mapping; m != nil {
		flags |= 0x04
		if m.DSN8 {
			flags |= 0x08
			b = binary.BigEndian.AppendUint64(b, m.DSN)
		} else {
			b = binary.BigEndian.AppendUint32(b, uint32(m.DSN))
		}
		b = binary.BigEndian.AppendUint32(b, m.SSN)
		b = binary.BigEndian.AppendUint16(b, m.Length)
		if m.Checksum != nil {
			b = binary.BigEndian.AppendUint16(b, *m.Checksum)
		}
	}
	if d.DataFIN {
		flags |= 0x10
	}
	b[1] = byte(len(b))
	b[3] = flags
	return b
}

// AddAddr is ADD_ADDR (section 3.4.1, figure 12): an address (IPv4 or IPv6,
// told apart by the length), an optional port (0: none) and, unless echo is
// set, the truncated HMAC.
func AddAddr(addrID uint8, addr netip.Addr, port uint16, echo bool, truncatedHMAC uint64) []byte {
	sub := byte(SubAddAddr << 4)
	if echo {
		sub |= 0x01
	}
	b := []byte{KindMPTCP, 0, sub, addrID}
	b = append(b, addr.AsSlice()...)
	if port != 0 {
		b = binary.BigEndian.AppendUint16(b, port)
	}
	if !echo {
		b = binary.BigEndian.AppendUint64(b, truncatedHMAC)
	}
	b[1] = byte(len(b))
	return b
}

// RemoveAddr is REMOVE_ADDR (section 3.4.2, figure 13) for one or more
// address ids.
func RemoveAddr(addrIDs ...uint8) []byte {
	b := []byte{KindMPTCP, byte(3 + len(addrIDs)), SubRemoveAddr << 4}
	return append(b, addrIDs...)
}

// MPPrio is MP_PRIO in its v1 form, length 3 (section 3.3.8, figure 11).
func MPPrio(backup bool) []byte {
	sub := byte(SubPrio << 4)
	if backup {
		sub |= 0x01
	}
	return []byte{KindMPTCP, 3, sub}
}

// MPFail is MP_FAIL (section 3.7, figure 16) with the 64-bit data sequence
// number of the failed data.
func MPFail(dsn uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{KindMPTCP, 12, SubFail << 4, 0}, dsn)
}

// MPFastclose is MP_FASTCLOSE (section 3.5, figure 14) with the receiver's
// key.
func MPFastclose(receiverKey uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{KindMPTCP, 12, SubFastclose << 4, 0}, receiverKey)
}

// TCPRst reasons and flags (section 3.6, figure 15).
const (
	TCPRstTransient           = 0x01 // T flag
	TCPRstReasonUnspecified   = 0x00
	TCPRstReasonProhibited    = 0x05 // administratively prohibited
	TCPRstReasonResourceLimit = 0x03
)

// MPTCPRst is MP_TCPRST (section 3.6, figure 15): the U, V, W, T flags in
// the low nibble of the subtype byte, and a reason code.
func MPTCPRst(flags, reason uint8) []byte {
	return []byte{KindMPTCP, 4, SubTCPRst<<4 | flags&0x0f, reason}
}

// MSS is the TCP maximum segment size option.
func MSS(v uint16) []byte { return binary.BigEndian.AppendUint16([]byte{2, 4}, v) }

// NOP is one no-operation option byte.
func NOP() []byte { return []byte{1} }

// Join concatenates options.
func Join(opts ...[]byte) []byte {
	var b []byte
	for _, o := range opts {
		b = append(b, o...)
	}
	return b
}

// SACKPermitted is the TCP SACK-permitted option.
func SACKPermitted() []byte { return []byte{4, 2} }

// Timestamps is the TCP timestamps option.
func Timestamps(val, echo uint32) []byte {
	b := binary.BigEndian.AppendUint32([]byte{8, 10}, val)
	return binary.BigEndian.AppendUint32(b, echo)
}

// WScale is the TCP window-scale option (RFC 7323 section 2.2).
func WScale(shift uint8) []byte { return []byte{3, 3, shift} }

// Fragments is the frame as two IP fragments of its transport header and
// payload, split at byte at (a multiple of 8): the first carries the first
// at bytes, the second the rest. An IPv6 frame gets a fragment header
// after its fixed header; it must have no extension header of its own.
func (f Frame) Fragments(at int) [][]byte {
	whole := f.Bytes()
	eth := 14 + 4*len(f.VLANs)
	var out [][]byte
	if f.Src.Is4() {
		hlen := int(whole[eth]&0x0f) * 4
		l4 := whole[eth+hlen:]
		for i, part := range [][]byte{l4[:at], l4[at:]} {
			h := append([]byte(nil), whole[eth:eth+hlen]...)
			binary.BigEndian.PutUint16(h[2:], uint16(hlen+len(part)))
			fragOff := uint16(0x2000) // MF, offset 0
			if i == 1 {
				fragOff = uint16(at / 8)
			}
			binary.BigEndian.PutUint16(h[6:], fragOff)
			h[10], h[11] = 0, 0
			binary.BigEndian.PutUint16(h[10:], ^fold(sum(0, h)))
			out = append(out, append(append(append([]byte(nil), whole[:eth]...), h...), part...))
		}
		return out
	}
	l4, proto := whole[eth+40:], whole[eth+6]
	for i, part := range [][]byte{l4[:at], l4[at:]} {
		h := append([]byte(nil), whole[eth:eth+40]...)
		h[6] = 44 // a fragment header follows
		binary.BigEndian.PutUint16(h[4:], uint16(8+len(part)))
		frag := []byte{proto, 0, 0, 1, 0, 0, 0x12, 0x34} // offset 0, M
		if i == 1 {
			binary.BigEndian.PutUint16(frag[2:], uint16(at)) // offset at/8, in its 13 high bits
		}
		out = append(out, append(append(append(append([]byte(nil), whole[:eth]...), h...), frag...), part...))
	}
	return out
}
