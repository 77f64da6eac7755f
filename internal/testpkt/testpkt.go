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
		l3 = ipv6(f.Src, f.Dst, proto, f.IPv6HopByHop, l4)
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

func ipv6(src, dst netip.Addr, proto uint8, hopByHop bool, payload []byte) []byte {
	next := proto
	var ext []byte
	if hopByHop {
		// Hop-by-hop header of 8 bytes: next header, length 0, PadN.
		ext = []byte{proto, 0, 1, 4, 0, 0, 0, 0}
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
	b := []byte{30, 12, flags, addrID}
	b = binary.BigEndian.AppendUint32(b, token)
	return binary.BigEndian.AppendUint32(b, nonce)
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
