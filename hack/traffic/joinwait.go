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

// joinWait keeps a sender's first byte back until the kernel's path
// manager has opened the connection's joins. On Linux 6.15 to 6.18 (6.4
// to 6.14 when the receive buffer is also full), a join that receives data
// while the receiving application holds the connection's lock can have that
// data placed at the wrong offset (docs/testing.md, "Root cause"); from
// 6.19 such a join can be reset instead. A connection that sends nothing while
// its joins come up never meets that window: a receiver with nothing to
// read does not hold the lock. The agent, as path manager, holds its joins
// itself; this is the same defence for connections whose joins the
// kernel's path manager opens, where nothing else can hold them.
type joinWait struct {
	want    int // joins to wait for
	timeout time.Duration
}

// await polls the connection's MPTCP_INFO until it counts w.want joins or
// w.timeout passes, then holds joinSettle; it returns the joins seen and
// whether it gave up waiting.
func (w joinWait) await(c *net.TCPConn) (joins int, timedOut bool) {
	deadline := time.Now().Add(w.timeout)
	for {
		info, err := mptcpnl.SocketInfo(c)
		if err == nil {
			joins = int(info.Subflows)
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
