package testbed

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"
)

// Control is a capture cut down to its control segments (ControlSegments).
type Control struct {
	CaptureFile // the cut-down copy, of the same node and NIC
	// Packets is how many packets the whole capture held, Kept how many
	// of them the copy holds.
	Packets, Kept int
	// Last is when the whole capture's last packet was captured; zero
	// when it held none.
	Last time.Time
}

// ControlSegments writes beside each capture a copy that holds only its TCP segments with SYN, FIN or RST set, and
// returns the copies. A transfer's captures hold hundreds of thousands of data segments, and tshark takes seconds
// for each pass over them; what a failover row reads of them (resets, the FINs before them, the subflows opened
// and their kinds) is all in the control segments, a few dozen. The copies are valid pcapng files (every block but
// the other packets is copied as it is) that tshark reads as it reads the whole captures, which stay where they
// are as the evidence.
func ControlSegments(files []CaptureFile) ([]Control, error) {
	out := make([]Control, 0, len(files))
	for _, f := range files {
		c, err := cutCapture(f, "control", func(seg segment) bool { return seg.control() })
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// FlowHeads writes beside each capture a copy that holds its control segments and the first flowHead segments of
// each direction of each subflow, and returns the copies. Every NIC that carried a subflow in a direction carried
// its first segments that way, and the segments that name a subflow's kind and connection (the handshake's, with
// the MPTCP keys and tokens) are among the first; the data segments in between repeat what those said.
func FlowHeads(files []CaptureFile) ([]Control, error) {
	out := make([]Control, 0, len(files))
	for _, f := range files {
		seen := map[string]int{}
		c, err := cutCapture(f, "heads", func(seg segment) bool {
			seen[seg.flow]++
			return seg.control() || seen[seg.flow] <= flowHead
		})
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// flowHead is how many segments of each direction of a subflow FlowHeads keeps in each capture: the handshake's
// and the first data segments.
const flowHead = 4

// ControlFiles returns the copies as capture files.
func ControlFiles(cs []Control) []CaptureFile {
	out := make([]CaptureFile, len(cs))
	for i, c := range cs {
		out[i] = c.CaptureFile
	}
	return out
}

// pcapng block types (the pcapng specification, draft-ietf-opsawg-pcapng).
const (
	blockSectionHeader    = 0x0A0D0D0A
	blockInterface        = 0x00000001
	blockEnhancedPacket   = 0x00000006
	byteOrderMagic        = 0x1A2B3C4D
	optionEnd             = 0
	optionIfTsresol       = 9
	linkTypeEthernet      = 1
	defaultTsresolPerSec  = 1e6 // microseconds, unless the interface says otherwise
	maxPcapngBlockLength  = 16 << 20
	tcpFlagsSynFinRstMask = 0x07 // FIN 0x01, SYN 0x02, RST 0x04
)

// cutCapture copies the capture f into a file beside it named with suffix, keeping the TCP segments keep says to
// keep (every block but the other packets is copied as it is), and returns the copy with its counts.
func cutCapture(f CaptureFile, suffix string, keep func(segment) bool) (Control, error) {
	c := Control{CaptureFile: f}
	c.Path = strings.TrimSuffix(f.Path, ".pcapng") + "-" + suffix + ".pcapng"
	if err := cut(f.Path, &c, keep); err != nil {
		return Control{}, fmt.Errorf("%s: %w", f.Path, err)
	}
	return c, nil
}

func cut(path string, c *Control, keepSegment func(segment) bool) error {
	in, err := os.Open(path)
	if err != nil {
		return err
	}
	defer in.Close()
	outFile, err := os.Create(c.Path)
	if err != nil {
		return err
	}
	defer outFile.Close()
	out := bufio.NewWriterSize(outFile, 1<<16)
	r := bufio.NewReaderSize(in, 1<<20)

	var order binary.ByteOrder = binary.LittleEndian
	type iface struct {
		link   uint16
		perSec float64
	}
	var ifaces []iface
	head := make([]byte, 8)
	var body []byte
	for {
		if _, err := io.ReadFull(r, head); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return fmt.Errorf("block header: %w", err)
		}
		typ := binary.LittleEndian.Uint32(head)
		if typ == blockSectionHeader {
			// The byte order of the section follows its length.
			var magic [4]byte
			if _, err := io.ReadFull(r, magic[:]); err != nil {
				return err
			}
			if binary.LittleEndian.Uint32(magic[:]) == byteOrderMagic {
				order = binary.LittleEndian
			} else {
				order = binary.BigEndian
			}
			ifaces = ifaces[:0]
			body = append(body[:0], magic[:]...)
		} else {
			typ = order.Uint32(head)
			body = body[:0]
		}
		total := order.Uint32(head[4:])
		if total < 12 || total%4 != 0 || total > maxPcapngBlockLength {
			return fmt.Errorf("block of type %#x has a bad length %d", typ, total)
		}
		rest := int(total) - 8 - len(body)
		body = append(body, make([]byte, rest)...)
		if _, err := io.ReadFull(r, body[len(body)-rest:]); err != nil {
			return fmt.Errorf("block of type %#x: %w", typ, err)
		}
		keep := true
		switch typ {
		case blockInterface:
			ifc := iface{perSec: defaultTsresolPerSec}
			if len(body) >= 12 {
				ifc.link = order.Uint16(body[0:])
				ifc.perSec = tsresol(order, body[8:len(body)-4])
			}
			ifaces = append(ifaces, ifc)
		case blockEnhancedPacket:
			if len(body) < 24 {
				return fmt.Errorf("enhanced packet block of %d bytes", total)
			}
			id := order.Uint32(body[0:])
			if int(id) >= len(ifaces) {
				return fmt.Errorf("packet of interface %d, which was not described", id)
			}
			ts := uint64(order.Uint32(body[4:]))<<32 | uint64(order.Uint32(body[8:]))
			captured := order.Uint32(body[12:])
			if 20+int(captured) > len(body)-4 {
				return fmt.Errorf("packet of %d bytes in a block of %d", captured, total)
			}
			c.Packets++
			perSec := ifaces[id].perSec
			sec := math.Floor(float64(ts) / perSec)
			c.Last = time.Unix(int64(sec), int64((float64(ts)-sec*perSec)*1e9/perSec))
			seg, ok := tcpSegment(body[20 : 20+captured])
			keep = ok && ifaces[id].link == linkTypeEthernet && keepSegment(seg)
			if keep {
				c.Kept++
			}
		}
		if !keep {
			continue
		}
		if _, err := out.Write(head); err != nil {
			return err
		}
		if _, err := out.Write(body); err != nil {
			return err
		}
	}
	if err := out.Flush(); err != nil {
		return err
	}
	return outFile.Close()
}

// tsresol reads if_tsresol from an interface description's options: ticks per second.
func tsresol(order binary.ByteOrder, opts []byte) float64 {
	for len(opts) >= 4 {
		code, n := order.Uint16(opts), int(order.Uint16(opts[2:]))
		if code == optionEnd || 4+n > len(opts) {
			break
		}
		if code == optionIfTsresol && n >= 1 {
			v := opts[4]
			if v&0x80 != 0 {
				return math.Pow(2, float64(v&0x7f))
			}
			return math.Pow(10, float64(v))
		}
		opts = opts[4+(n+3)&^3:]
	}
	return defaultTsresolPerSec
}

// segment is what a cut reads of a captured TCP segment: its flags, and its addresses and ports as raw bytes, which
// tell one direction of a subflow from the others.
type segment struct {
	flags uint8
	flow  string // source and destination address, source and destination port
}

func (s segment) control() bool { return s.flags&tcpFlagsSynFinRstMask != 0 }

// tcpSegment reads the TCP segment of an Ethernet frame (IPv4, or IPv6 without extension headers, as the bed sends
// them, behind any VLAN tags, or inside VXLAN); false when the frame holds none, or a fragment but the first.
func tcpSegment(frame []byte) (segment, bool) {
	if len(frame) < 14 {
		return segment{}, false
	}
	etherType, ip := binary.BigEndian.Uint16(frame[12:]), frame[14:]
	for (etherType == 0x8100 || etherType == 0x88a8) && len(ip) >= 4 { // 802.1Q and 802.1ad tags
		etherType, ip = binary.BigEndian.Uint16(ip[2:]), ip[4:]
	}
	var addrs, tcp []byte
	switch etherType {
	case 0x0800:
		if len(ip) < 20 || binary.BigEndian.Uint16(ip[6:])&0x1fff != 0 {
			return segment{}, false
		}
		ihl := int(ip[0]&0x0f) * 4
		if ihl < 20 || len(ip) < ihl {
			return segment{}, false
		}
		// VXLAN (an underlay bed's): the segment of the inner frame, behind the UDP and VXLAN headers.
		if udp := ip[ihl:]; ip[9] == 17 && len(udp) >= 16 && isTunnelPort(binary.BigEndian.Uint16(udp[2:])) {
			return tcpSegment(udp[16:])
		}
		if ip[9] != 6 {
			return segment{}, false
		}
		addrs, tcp = ip[12:20], ip[ihl:]
	case 0x86DD:
		if len(ip) < 40 || ip[6] != 6 {
			return segment{}, false
		}
		addrs, tcp = ip[8:40], ip[40:]
	default:
		return segment{}, false
	}
	if len(tcp) < 14 {
		return segment{}, false
	}
	return segment{flags: tcp[13], flow: string(addrs) + string(tcp[:4])}, true
}
