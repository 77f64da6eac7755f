package testbed

import (
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// Forge sends IPv4 packets, each a whole packet from its IP header on,
// from inside network namespace ns (a name under /var/run/netns, e.g. a
// fabric's), as a sender on that fabric would: their source addresses are
// whatever they say, so a test can play a remote attacker who writes a
// victim's 4-tuple. Packets go to their own destination address, routed by
// ns, spread evenly over d (0: at once). The tests that use it bound the
// count and the time, and use bed addresses only.
func (b *Bed) Forge(ns string, packets [][]byte, d time.Duration) error {
	return netnsutil.Do("/var/run/netns/"+ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW) // IP_HDRINCL
		if err != nil {
			return fmt.Errorf("raw socket in %s: %w", ns, err)
		}
		defer unix.Close(fd)
		var gap time.Duration
		if len(packets) > 0 {
			gap = d / time.Duration(len(packets))
		}
		for i, p := range packets {
			if len(p) < 20 || p[0]>>4 != 4 {
				return fmt.Errorf("packet %d is not IPv4", i)
			}
			dst, _ := netip.AddrFromSlice(p[16:20])
			if !b.owns(dst) {
				return fmt.Errorf("packet %d goes to %v, not an address of bed %s", i, dst, b.Name)
			}
			if err := unix.Sendto(fd, p, 0, &unix.SockaddrInet4{Addr: dst.As4()}); err != nil {
				return fmt.Errorf("sending packet %d from %s: %w", i, ns, err)
			}
			if gap > 0 {
				time.Sleep(gap)
			}
		}
		return nil
	})
}

// owns says whether addr is a pod's or a NIC's address of the bed.
func (b *Bed) owns(addr netip.Addr) bool {
	for _, n := range b.Nodes {
		if n.PodCIDR.Contains(addr) {
			return true
		}
		for _, c := range n.NICs {
			if c.Addr.Contains(addr) {
				return true
			}
		}
	}
	return false
}
