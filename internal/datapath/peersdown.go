package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// PathMask is a set of path indexes: bit i stands for path i.
type PathMask uint32

// With is m with path in it.
func (m PathMask) With(path uint32) PathMask {
	if !ValidPath(path) {
		return m
	}
	return m | 1<<path
}

// Has says whether path is in m.
func (m PathMask) Has(path uint32) bool { return ValidPath(path) && m&(1<<path) != 0 }

// SetPeersDown tells pod_egress which paths carry nothing to which peers'
// pods while other peers keep them up: a packet to an address in one of
// the prefixes (a peer node's pod CIDRs) travels as if those paths were
// down (bpf/include/detour.h). An empty mask is no entry. The map is
// written whole (writePeerCIDRs).
func (d *Datapath) SetPeersDown(down map[netip.Prefix]PathMask) error {
	want := map[datapathPeerCidrKey]datapathPeerPaths{}
	for prefix, mask := range down {
		if mask == 0 {
			continue
		}
		k, err := peerCIDRKey(prefix)
		if err != nil {
			return fmt.Errorf("peers down: %w", err)
		}
		want[k] = datapathPeerPaths{Down: uint32(mask)}
	}
	return writePeerCIDRs(d.objs.PeersDown, d.objs.PeersDownUsed, want)
}

// writePeerCIDRs makes m, a map keyed by peers' pod CIDRs, hold exactly
// want, and writes its size to entry 0 of used, last: a packet never finds
// the count on while an entry it counts is missing.
func writePeerCIDRs[V comparable](m, used *ebpf.Map, want map[datapathPeerCidrKey]V) error {
	n := uint32(len(want))
	if len(want) > limits.PeerCIDRs {
		return fmt.Errorf("%s: %d prefixes, at most %d", m, len(want), limits.PeerCIDRs)
	}
	var stale []datapathPeerCidrKey
	var k datapathPeerCidrKey
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		if w, ok := want[k]; !ok {
			stale = append(stale, k)
		} else if w == v {
			delete(want, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", m, err)
	}
	for _, k := range stale {
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting from %s: %w", m, err)
		}
	}
	for k, v := range want {
		if err := m.Update(&k, &v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("writing %s: %w", m, err)
		}
	}
	if err := used.Put(uint32(0), n); err != nil {
		return fmt.Errorf("writing %s's count: %w", m, err)
	}
	return nil
}

// peerCIDRKey is prefix's key in peers_down; an IPv4-mapped prefix is the
// IPv4 one.
func peerCIDRKey(prefix netip.Prefix) (datapathPeerCidrKey, error) {
	if !prefix.IsValid() {
		return datapathPeerCidrKey{}, errors.New("invalid prefix")
	}
	addr, bits := prefix.Addr(), prefix.Bits()
	if addr.Is4In6() {
		if bits < 96 {
			return datapathPeerCidrKey{}, fmt.Errorf("%s: an IPv4-mapped prefix shorter than /96", prefix)
		}
		addr, bits = addr.Unmap(), bits-96
	}
	addr = netip.PrefixFrom(addr, bits).Masked().Addr()
	k := datapathPeerCidrKey{Prefixlen: uint32(peerKeyFixedBits + bits), Family: family(addr)}
	copy(k.Addr[:], addr.AsSlice())
	return k, nil
}

// peerKeyFixedBits is PEER_KEY_FIXED_BITS: the family's byte and padding.
const peerKeyFixedBits = 32
