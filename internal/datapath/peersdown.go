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
// written whole: entries no longer wanted go, and the count that lets the
// datapath skip the lookup is written last, so that a packet never finds
// it on while an entry it counts is missing.
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
	used := uint32(len(want))
	if len(want) > limits.PeerCIDRs {
		return fmt.Errorf("peers down: %d prefixes, at most %d", len(want), limits.PeerCIDRs)
	}
	var stale []datapathPeerCidrKey
	var k datapathPeerCidrKey
	var v datapathPeerPaths
	it := d.objs.PeersDown.Iterate()
	for it.Next(&k, &v) {
		if w, ok := want[k]; !ok {
			stale = append(stale, k)
		} else if w == v {
			delete(want, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading peers down: %w", err)
	}
	for _, k := range stale {
		if err := d.objs.PeersDown.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting peers down: %w", err)
		}
	}
	for k, v := range want {
		if err := d.objs.PeersDown.Update(&k, &v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("writing peers down: %w", err)
		}
	}
	if err := d.objs.PeersDownUsed.Put(uint32(0), used); err != nil {
		return fmt.Errorf("writing peers down: %w", err)
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
