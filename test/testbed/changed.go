package testbed

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/mptcp-operator/mptcp-operator/hack/traffic/report"
	"github.com/mptcp-operator/mptcp-operator/hack/traffic/stream"
)

// CarrierPacket is a data packet of a connection whose data-level mapping
// covers part of a changed range of its stream: one of the packets that may
// have carried the wrong bytes, as a wire saw it.
type CarrierPacket struct {
	Node, NIC int
	Dir       Direction
	// Time is seconds since the start of the node's capture.
	Time     float64
	Src, Dst netip.AddrPort
	// Offset and Len locate the packet's payload in the stream (the
	// preamble included), from its DSS mapping.
	Offset, Len int64
	// Retransmission and Reinjection say whether tshark saw the packet's
	// bytes before on this subflow, or on another subflow of the connection.
	Retransmission, Reinjection bool
	// Payload is what the capture kept of the packet's data (nothing with
	// header-only captures).
	Payload []byte
}

// comparePayload says whether the captured payload is what was sent at the
// packet's offsets of stream (seed, conn), and if not, where it differs and
// whether the bytes there were sent elsewhere in the stream.
func (p CarrierPacket) comparePayload(seed uint64, conn int) string {
	if len(p.Payload) == 0 {
		return ""
	}
	want := stream.Range(seed, conn, p.Offset, int64(len(p.Payload)))
	first, last := -1, -1
	for i := range p.Payload {
		if p.Payload[i] != want[i] {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		return fmt.Sprintf(": payload as sent (%d bytes captured)", len(p.Payload))
	}
	return fmt.Sprintf(": PAYLOAD DIFFERS from what was sent in stream [%d, %d)", p.Offset+int64(first), p.Offset+int64(last)+1)
}

func (p CarrierPacket) String() string {
	s := fmt.Sprintf("node%d nic%d %s t=%.6f %v -> %v stream [%d, %d)", p.Node, p.NIC, p.Dir, p.Time, p.Src, p.Dst, p.Offset, p.Offset+p.Len)
	if p.Retransmission {
		s += " retransmission"
	}
	if p.Reinjection {
		s += " reinjection"
	}
	return s
}

// carrierFields are the fields DecodeChangedRanges reads, in order.
var carrierFields = []string{
	"frame.interface_id", "eth.src", "frame.time_relative", "ip.src", "tcp.srcport", "ip.dst", "tcp.dstport",
	"tcp.len", "mptcp.dsn", "mptcp.stream", "tcp.analysis.retransmission", "mptcp.reinjection_of", "tcp.payload",
}

// DecodeChangedRanges finds, in captures, the data packets of the MPTCP
// connection whose first subflow the sender opened from initial, whose
// payload overlaps one of the changed ranges: which subflow, wire and
// moment carried the bytes that arrived wrong. tshark maps each packet to
// the stream through its DSS mapping (relative data sequence numbers: the
// stream's first byte is DSN 1), so the captures need the connection's
// MP_CAPABLE handshake; headers suffice, no payload is read.
func DecodeChangedRanges(files []CaptureFile, initial netip.AddrPort, ranges []report.Range) ([]CarrierPacket, error) {
	var out []CarrierPacket
	for _, node := range byNode(files) {
		input, err := mergeNode(node)
		if err != nil {
			return nil, err
		}
		pkts, err := carrierPackets(node, input, initial, ranges)
		if err != nil {
			return nil, err
		}
		out = append(out, pkts...)
	}
	return out, nil
}

func carrierPackets(files []CaptureFile, input string, initial netip.AddrPort, ranges []report.Range) ([]CarrierPacket, error) {
	data, err := tsharkRows(input, "tcp && ip && mptcp.stream", false, carrierFields, "mptcp.analyze_mptcp:TRUE",
		"mptcp.relative_sequence_numbers:TRUE", "mptcp.analyze_mappings:TRUE", "mptcp.intersubflows_retransmission:TRUE")
	if err != nil {
		return nil, err
	}
	type row struct {
		p      CarrierPacket
		stream string
		dsn    int64
	}
	var rows []row
	stream := "" // the connection's mptcp.stream, from its initial subflow
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "|")
		if len(f) != len(carrierFields) {
			continue
		}
		iface, err := strconv.Atoi(f[0])
		if err != nil || iface >= len(files) {
			return nil, fmt.Errorf("tshark: bad interface id %q", f[0])
		}
		src, err1 := addrPort(f[3], f[4])
		dst, err2 := addrPort(f[5], f[6])
		if err1 != nil || err2 != nil {
			continue
		}
		if stream == "" && src == initial {
			stream = f[9]
		}
		n, _ := strconv.ParseInt(f[7], 10, 64)
		dsn, err := strconv.ParseInt(f[8], 10, 64)
		if n == 0 || err != nil {
			continue
		}
		t, _ := strconv.ParseFloat(f[2], 64)
		dir := In
		if strings.EqualFold(f[1], files[iface].NodeMAC) {
			dir = Out
		}
		rows = append(rows, row{stream: f[9], dsn: dsn, p: CarrierPacket{
			Node: files[iface].Node, NIC: files[iface].NIC, Dir: dir, Time: t, Src: src, Dst: dst,
			Offset: dsn - 1, Len: n, Retransmission: f[10] != "", Reinjection: f[11] != "",
		}})
		if payload, err := hex.DecodeString(strings.ReplaceAll(f[12], ":", "")); err == nil && int64(len(payload)) <= n {
			rows[len(rows)-1].p.Payload = payload
		}
	}
	var out []CarrierPacket
	for _, r := range rows {
		if r.stream != stream || r.p.Src.Addr() != initial.Addr() {
			continue
		}
		for _, rg := range ranges {
			if r.p.Offset < rg.End && rg.Start < r.p.Offset+r.p.Len {
				out = append(out, r.p)
				break
			}
		}
	}
	return out, nil
}
