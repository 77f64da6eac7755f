package main

import (
	"net"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
)

// joinSettle is how long a sender holds its data after its connection's
// joins are up: the agent holds its own joins as long (docs/subflows.md,
// "Held joins"), long after the receiver has taken the joins in.
const joinSettle = 20 * time.Millisecond

// joinWait keeps a sender's data after its preamble back until the path
// manager has opened the connection's joins and their acceptor has taken
// each in. The preamble, a few bytes the receiver reads at once, makes the
// connection fully established: no path manager opens joins before. On
// Linux 6.15 to 6.18 (6.4 to 6.14 when the receive buffer is also full), a
// join that receives data while the receiving application holds the
// connection's lock can have that data placed at the wrong offset
// (docs/testing.md, "Root cause"); from 6.19 such a join can be reset
// instead. A connection that sends nothing more until its acceptor has
// taken its joins in never meets that window: a receiver with nothing to
// read does not hold the lock. The agent, as path manager, holds its joins
// itself; this is the same defence where nothing else holds them: joins the
// kernel's path manager opens, or an agent that does not hold its own.
type joinWait struct {
	want    int // joins to wait for
	timeout time.Duration
	after   int // bytes written before the wait: the preamble, or more
}

// await polls the connection until w.want joins can carry data or
// w.timeout passes, then holds joinSettle; it returns the joins seen and
// whether it gave up waiting.
//
// MPTCP_INFO counts a join from its SYN on, and a loaded host can take
// longer than joinSettle to finish the handshake, so a join is counted here
// only once its acceptor has answered the third ACK: the join's second
// received segment, its SYN-ACK being the first (MPTCP_TCPINFO's
// tcpi_segs_in), the acknowledgement that also lets the kernel send on it. A kernel
// without MPTCP_TCPINFO (before 5.16) is left with MPTCP_INFO's count.
func (w joinWait) await(c *net.TCPConn) (joins int, timedOut bool) {
	deadline := time.Now().Add(w.timeout)
	perSubflow := true
	for {
		info, err := mptcpnl.SocketInfo(c)
		if err == nil {
			joins = int(info.Subflows)
		}
		if err == nil && joins >= w.want && perSubflow {
			subflows, serr := mptcpnl.SubflowTCPInfo(c)
			if serr != nil {
				perSubflow = false
			} else {
				joins = answeredJoins(subflows)
			}
		}
		if joins >= w.want {
			break
		}
		if err != nil || time.Now().After(deadline) {
			// Not a failure: the transfer goes on, and its report says
			// the joins that came up late were not held.
			timedOut = true
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(joinSettle)
	return joins, timedOut
}

// answeredJoins counts the subflows beyond the first whose peer has answered
// their handshake's last segment: established, with a segment received after
// the SYN-ACK. The first subflow is the connection's own; the path manager
// opens joins only once it is fully established.
func answeredJoins(subflows []mptcpnl.SubflowTCP) int {
	n := 0
	for i, s := range subflows {
		if i > 0 && s.Established && s.SegmentsIn >= 2 {
			n++
		}
	}
	return n
}
