package agent

import (
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// TCPListeners are the listening sockets of pod that take TCP only, but
// those on loopback addresses (no other node reaches them): under
// transparent MPTCP, programs the library or the socket program did not
// reach.
func (a *Agent) TCPListeners(pod PlanPod) ([]netip.AddrPort, error) {
	fd, err := netnsutil.Open(pod.NetNS)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	ls, err := mptcpnl.ListListeners(fd)
	if err != nil {
		return nil, err
	}
	var out []netip.AddrPort
	for _, l := range ls {
		if !l.MPTCP && !l.Local.Addr().IsLoopback() {
			out = append(out, l.Local)
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out, nil
}
