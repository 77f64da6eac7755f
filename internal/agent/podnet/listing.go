package podnet

import "github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"

// The path managers read their pods' sockets (sock_diag) for the join
// threshold and for closed connections. A pod decides how many sockets a
// listing reads (up to 65536, within 2 s), so the listings of all the
// node's path managers share maxListings slots: a pod that makes its own
// listings slow makes them wait, and the node does no more of them at once.
const maxListings = 2

// listing holds one of the node's listing slots while fn runs; without
// slots (a path manager made by a test), it runs fn.
func (s *pathManager) listing(fn func()) {
	if s.listings != nil {
		s.listings <- struct{}{}
		defer func() { <-s.listings }()
	}
	fn()
}

// readSubflows lists the pod's subflows in a listing slot, on the path
// manager's own socket, unless it stopped (as listSubflows).
func (s *pathManager) readSubflows() (sfs []mptcpnl.Subflow, err error) {
	s.listing(func() {
		s.life.RLock()
		defer s.life.RUnlock()
		if !s.stopped {
			sfs, err = s.lister.Subflows()
		}
	})
	return sfs, err
}

// listOpenSockets lists the pod's open TCP sockets as readSubflows does.
func (s *pathManager) listOpenSockets() (socks []mptcpnl.SocketEnds, err error) {
	s.listing(func() {
		s.life.RLock()
		defer s.life.RUnlock()
		if !s.stopped {
			socks, err = s.lister.OpenTCPSockets()
		}
	})
	return socks, err
}
