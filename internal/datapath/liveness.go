package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// LivenessPeer is a peer's prober as nic_ingress admits it: its address on
// the path, and the nonce this node's prober uses towards it, which every
// echo and every proven probe of the peer carries (bpf/datapath.c,
// struct liveness_peer).
type LivenessPeer struct {
	Addr  netip.Addr
	Nonce uint64
}

// SetLivenessPeers tells nic_ingress who may send to the liveness port of
// each of the node's path addresses: the peers' probers on that path
// (local address: its peers), probing every interval at the shortest and
// every own interval (this node's) as a rule. A datagram to a
// listed address's liveness port from anything but a listed peer, from the
// same port, is dropped before the agent's socket (StatLivenessRefused), and
// so is what a peer's address sends past its budget: echoes and proven
// probes (carrying the peer's nonce) four per interval, other probes two.
// Besides its own, the unproven probes to one address share a budget of
// two per peer per interval, at most one per MinSharedUnprovenGap: a flood
// forged with many peers' addresses at once passes no faster than that,
// whatever the number of peers. Before both, each peer's first unproven
// probe of every own interval (this node's probe interval, which its peers
// share) passes on the peer's account alone, so that such a flood starves
// only the peers whose addresses it forges.
// An address not listed is not filtered, and nil filters nothing. A peer of
// another family than its local address is left out. It fails open: a
// write that fails leaves no address filtered whose peers it did not all
// write. A peer whose nonce and interval are unchanged keeps its budget.
func (d *Datapath) SetLivenessPeers(peers map[netip.Addr][]LivenessPeer, interval, own time.Duration) error {
	gap := uint64(max(interval/4, time.Microsecond))
	floor := uint64(max(own, time.Microsecond))
	want := map[datapathLivenessPair]datapathLivenessPeer{}
	for local, ps := range peers {
		local = local.Unmap()
		if !local.IsValid() {
			return d.filterNothing(errors.New("liveness peers: invalid local address"))
		}
		shared := max(interval/time.Duration(2*max(len(ps), 1)), MinSharedUnprovenGap)
		want[livenessPair(local, netip.Addr{})] = datapathLivenessPeer{UnprovenGapNs: uint64(shared)}
		for _, peer := range ps {
			if addr := peer.Addr.Unmap(); addr.Is4() == local.Is4() {
				want[livenessPair(local, addr)] = datapathLivenessPeer{Nonce: peer.Nonce, GapNs: gap, FloorGapNs: floor}
			}
		}
	}
	if len(want) > limits.LivenessPairs {
		return d.filterNothing(fmt.Errorf("liveness peers: %d pairs of addresses, at most %d", len(want), limits.LivenessPairs))
	}
	var stale []datapathLivenessPair
	kept := map[datapathLivenessPair]bool{}
	var k datapathLivenessPair
	var v datapathLivenessPeer
	it := d.objs.LivenessPeers.Iterate()
	for it.Next(&k, &v) {
		w, ok := want[k]
		switch {
		case !ok:
			stale = append(stale, k)
		case w.Nonce == v.Nonce && w.GapNs == v.GapNs && w.UnprovenGapNs == v.UnprovenGapNs && w.FloorGapNs == v.FloorGapNs:
			kept[k] = true
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
		for k, v := range want {
			if (k.Peer == [16]uint8{}) != local || kept[k] {
				continue
			}
			if err := d.objs.LivenessPeers.Update(&k, &v, ebpf.UpdateAny); err != nil {
				return d.filterNothing(fmt.Errorf("writing liveness peers: %w", err))
			}
		}
	}
	return nil
}

// MinSharedUnprovenGap is the shortest gap between two unproven probes to one of
// the node's addresses, whatever its peers: 20,000 a second, a sixth of
// the flood that overflowed an unfiltered prober's socket on a two-core
// node (docs/benchmarks.md, "Liveness under a forged flood").
const MinSharedUnprovenGap = 50 * time.Microsecond

// filterNothing takes every local address out of the liveness filter, so
// that a failed write refuses no peer, and returns err.
func (d *Datapath) filterNothing(err error) error {
	var locals []datapathLivenessPair
	var k datapathLivenessPair
	var v datapathLivenessPeer
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
