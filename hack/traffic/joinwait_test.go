package main

import (
	"testing"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
)

// A join counts once its peer answered the handshake: established and a
// segment received after the SYN-ACK. The connection's first subflow never
// counts, nor does a join still waiting for its SYN-ACK or holding only it.
func TestOnlyAnsweredJoinsCount(t *testing.T) {
	answered := mptcpnl.SubflowTCP{Established: true, SegmentsIn: 2}
	synAckOnly := mptcpnl.SubflowTCP{Established: true, SegmentsIn: 1}
	synSent := mptcpnl.SubflowTCP{}
	for _, tc := range []struct {
		name     string
		subflows []mptcpnl.SubflowTCP
		want     int
	}{
		{"the first subflow alone", []mptcpnl.SubflowTCP{answered}, 0},
		{"a join answered", []mptcpnl.SubflowTCP{answered, answered}, 1},
		{"a join with only its SYN-ACK", []mptcpnl.SubflowTCP{answered, synAckOnly}, 0},
		{"a join waiting for its SYN-ACK", []mptcpnl.SubflowTCP{answered, synSent}, 0},
		{"one of two joins answered", []mptcpnl.SubflowTCP{answered, synAckOnly, answered}, 1},
	} {
		if got := answeredJoins(tc.subflows); got != tc.want {
			t.Errorf("%s: %d answered joins, want %d", tc.name, got, tc.want)
		}
	}
}
