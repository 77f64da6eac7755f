package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// maxListeners bounds the listening sockets read from one pod: a pod's
// processes decide how many there are, and a report names a few.
const maxListeners = 1024

// TCPListeners are the distinct addresses on which pod listens with TCP
// only, but loopback ones (no other node reaches them), sorted: under
// transparent MPTCP, programs the library or the socket program did not
// reach. A pod with more than maxListeners listening sockets is an error.
func (a *Agent) TCPListeners(pod PlanPod) ([]netip.AddrPort, error) {
	fd, err := openPodNetNS(pod)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	ls, err := mptcpnl.ListListeners(fd, maxListeners)
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
	// SO_REUSEPORT workers share an address.
	return slices.Compact(out), nil
}

// openPodNetNS opens pod's network namespace and checks it is still the
// one its host-side veth leads to: the path was found a reconcile ago, and
// a /proc/<pid>/ns/net path may name another process's namespace since.
// The caller closes the descriptor, and reads the namespace through it.
func openPodNetNS(pod PlanPod) (int, error) {
	link, err := netlink.LinkByName(pod.HostInterface)
	if err != nil {
		return -1, fmt.Errorf("pod %s's veth %s: %w", pod.Name, pod.HostInterface, err)
	}
	fd, err := netnsutil.Open(pod.NetNS)
	if err != nil {
		return -1, err
	}
	id, err := netlink.GetNetNsIdByFd(fd)
	if err == nil && id != link.Attrs().NetNsID {
		err = errors.New("its namespace is no longer the one its veth leads to")
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	return fd, nil
}
