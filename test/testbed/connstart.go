package testbed

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// connectionStartWindow is how much of a connection's start
// WriteConnectionStart lists, from its first SYN.
const connectionStartWindow = 0.5 // seconds

// connectionStartFields are what WriteConnectionStart lists per packet, in
// order; the first five find the connection and the direction.
var connectionStartFields = []string{
	"frame.interface_id", "eth.src", "mptcp.stream", "ip.src", "tcp.srcport",
	"frame.time_relative", "ip.dst", "tcp.dstport", "tcp.flags.str", "tcp.options.mptcp.subtype",
	"tcp.len", "mptcp.dsn", "mptcp.ack",
}

// WriteConnectionStart writes, for each node, the first half second of the
// MPTCP connection whose first subflow the sender opened from initial, every
// packet of every subflow seen on the node's wires: its direction, flags,
// MPTCP option subtypes (0 MP_CAPABLE, 1 MP_JOIN, 2 DSS), length, data
// sequence number and data ACK, both relative to the stream (its first byte
// is 1). Files are dir/connection-start-<name>-node<i>.txt.
//
// What it is for: a stream changed at its start (docs/testing.md,
// "Candidate mechanism") is read there. On the receiver's node: when each
// join's third ACK (an ACK with MP_JOIN, no SYN) arrived, the last data ACK
// the receiver sent before it, and the first mapping the join carried.
func WriteConnectionStart(dir, name string, files []CaptureFile, initial netip.AddrPort) error {
	for _, node := range byNode(files) {
		input, err := mergeNode(node)
		if err != nil {
			return err
		}
		text, err := connectionStart(node, input, initial)
		if err != nil {
			return err
		}
		path := filepath.Join(dir, fmt.Sprintf("connection-start-%s-node%d.txt", name, node[0].Node))
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func connectionStart(files []CaptureFile, input string, initial netip.AddrPort) (string, error) {
	data, err := tsharkRows(input, "tcp && ip && mptcp.stream", true, connectionStartFields, "mptcp.analyze_mptcp:TRUE",
		"mptcp.relative_sequence_numbers:TRUE", "mptcp.analyze_mappings:TRUE")
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# connection from %v, first %.1f s after its SYN on this node's wires (node%d)\n", initial, connectionStartWindow, files[0].Node)
	b.WriteString("# time wire dir src -> dst flags mptcp-subtypes len dsn data-ack\n")
	stream, start := "", 0.0
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "|")
		if len(f) != len(connectionStartFields) {
			continue
		}
		t, _ := strconv.ParseFloat(f[5], 64)
		if stream == "" {
			src, err := addrPort(f[3], f[4])
			if err != nil || src != initial {
				continue
			}
			stream, start = f[2], t
		}
		if f[2] != stream {
			continue
		}
		if t-start > connectionStartWindow {
			break
		}
		iface, err := strconv.Atoi(f[0])
		if err != nil || iface >= len(files) {
			return "", fmt.Errorf("tshark: bad interface id %q", f[0])
		}
		dir := In
		if strings.EqualFold(f[1], files[iface].NodeMAC) {
			dir = Out
		}
		fmt.Fprintf(&b, "%.6f nic%d %s %s:%s -> %s:%s %s [%s] len %s dsn %s ack %s\n", t-start, files[iface].NIC, dir,
			f[3], f[4], f[6], f[7], f[8], f[9], f[10], dash(f[11]), dash(f[12]))
	}
	if stream == "" {
		b.WriteString("# no packet of the connection was captured here\n")
	}
	return b.String(), nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
