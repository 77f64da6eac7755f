package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// SetLivenessPeers tells nic_ingress who may send to the liveness port of
// each of the node's path addresses: the peers' addresses on that path
// (local address: its peers' addresses). A datagram to a listed address's
// liveness port from anything but a listed peer, from the same port, is
// dropped before the agent's socket (StatLivenessRefused); an address not
// listed is not filtered, and nil filters nothing. A peer of another
// family than its local address is left out. It fails open: a write that
// fails leaves no address filtered whose peers it did not all write.
func (d *Datapath) SetLivenessPeers(peers map[netip.Addr][]netip.Addr) error {
	want := map[datapathLivenessPair]bool{}
	for local, addrs := range peers {
		local = local.Unmap()
		if !local.IsValid() {
			return d.filterNothing(errors.New("liveness peers: invalid local address"))
		}
		want[livenessPair(local, netip.Addr{})] = true
		for _, peer := range addrs {
			if peer = peer.Unmap(); peer.Is4() == local.Is4() {
				want[livenessPair(local, peer)] = true
			}
		}
	}
	if len(want) > limits.LivenessPairs {
		return d.filterNothing(fmt.Errorf("liveness peers: %d pairs of addresses, at most %d", len(want), limits.LivenessPairs))
	}
	var stale []datapathLivenessPair
	var k datapathLivenessPair
	var v uint8
	it := d.objs.LivenessPeers.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading liveness peers: %w", err)
	}
	// The stale pairs go first, to make room; then the peers, then the
	// local addresses that say a filter is on: a peer that stays is never
	// refused meanwhile, and a new one only until it is written.
	for _, k := range stale {
		if err := d.objs.LivenessPeers.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return d.filterNothing(fmt.Errorf("deleting liveness peers: %w", err))
		}
	}
	for _, local := range []bool{false, true} {
		for k := range want {
			if (k.Peer == [16]uint8{}) != local {
				continue
			}
			if err := d.objs.LivenessPeers.Update(&k, uint8(1), ebpf.UpdateAny); err != nil {
				return d.filterNothing(fmt.Errorf("writing liveness peers: %w", err))
			}
		}
	}
	return nil
}

// filterNothing takes every local address out of the liveness filter, so
// that a failed write refuses no peer, and returns err.
func (d *Datapath) filterNothing(err error) error {
	var locals []datapathLivenessPair
	var k datapathLivenessPair
	var v uint8
	it := d.objs.LivenessPeers.Iterate()
	for it.Next(&k, &v) {
		if k.Peer == [16]uint8{} {
			locals = append(locals, k)
		}
	}
	errs := []error{err, it.Err()}
	for _, k := range locals {
		if derr := d.objs.LivenessPeers.Delete(&k); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
			errs = append(errs, derr)
		}
	}
	return errors.Join(errs...)
}

// livenessPair is the key of local's liveness peer peer (zero: local's own
// entry, which says local is filtered).
func livenessPair(local, peer netip.Addr) datapathLivenessPair {
	k := datapathLivenessPair{Family: family(local)}
	copy(k.Local[:], local.AsSlice())
	if peer.IsValid() {
		copy(k.Peer[:], peer.AsSlice())
	}
	return k
}
