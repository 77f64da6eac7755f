package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// ForgetLocal removes what the datapath learnt about the local pod
// addresses addrs once no rule selects them (call DeleteEndpoint first):
// their connections, their rate buckets, windows and subflow rate state, and
// their subflows except those keep wants. A kept subflow still lets its
// packets through reverse-path filtering on the NIC they arrive on (its peer
// may still send them there); the caller keeps the ones whose sockets are
// open. It returns how many subflows of each address remain. Each map is
// walked once, however many addresses there are.
func (d *Datapath) ForgetLocal(addrs []netip.Addr, keep func(Subflow) bool) (remaining map[netip.Addr]int, err error) {
	type rawAddr struct {
		family uint8
		addr   [16]byte
	}
	forget := map[rawAddr]bool{}
	remaining = map[netip.Addr]int{}
	for _, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() {
			return nil, errors.New("forget: invalid address")
		}
		var r rawAddr
		r.family = family(a)
		copy(r.addr[:], a.AsSlice())
		forget[r] = true
		remaining[a] = 0
	}
	local := func(f uint8, a [16]uint8) bool { return forget[rawAddr{f, a}] }

	sfs, err := d.Subflows()
	if err != nil {
		return nil, fmt.Errorf("forget: listing subflows: %w", err)
	}
	var forgotten uint64
	for _, sf := range sfs {
		if _, ok := remaining[sf.Local.Addr()]; !ok {
			continue
		}
		if keep(sf) {
			remaining[sf.Local.Addr()]++
			continue
		}
		n, err := d.deleteTable(tableSubflows, flowKey(sf.Local, sf.Remote))
		if err != nil {
			return nil, fmt.Errorf("forget: subflow %v -> %v: %w", sf.Local, sf.Remote, err)
		}
		forgotten += uint64(n)
	}
	if err := d.countForgotten(StatSubflowForgotten, forgotten); err != nil {
		return nil, err
	}
	if _, err := deleteKeysWhere(d.objs.RateSubflows, func(k datapathFlowKey) bool { return local(k.Family, k.Saddr) }); err != nil {
		return nil, fmt.Errorf("forget: subflow rate state: %w", err)
	}
	if _, err := deleteKeysWhere(d.objs.ConnAliases, func(k datapathConnKey) bool { return local(k.Family, k.Local) }); err != nil {
		return nil, fmt.Errorf("forget: connection aliases: %w", err)
	}
	conns, err := deleteKeysWhere(d.objs.ConnStates, func(k datapathConnKey) bool { return local(k.Family, k.Local) })
	if err != nil {
		return nil, fmt.Errorf("forget: connections: %w", err)
	}
	if err := d.countForgotten(StatConnForgotten, uint64(conns)); err != nil {
		return nil, err
	}
	// Path buckets and windows have no address; every other kind is the
	// pod's own.
	if _, err := deleteKeysWhere(d.objs.RateWindows, func(k datapathRateKey) bool { return local(k.Family, k.Addr) }); err != nil {
		return nil, fmt.Errorf("forget: rate windows: %w", err)
	}
	buckets, err := d.policeKeys()
	if err != nil {
		return nil, fmt.Errorf("forget: listing police buckets: %w", err)
	}
	for _, k := range buckets {
		if !local(k.Family, k.Addr) {
			continue
		}
		if _, err := d.deleteTable(tablePolice, k); err != nil {
			return nil, fmt.Errorf("forget: police bucket: %w", err)
		}
	}
	return remaining, nil
}

// flowKey is the subflow table's key of a subflow as the local pod sends it.
func flowKey(local, remote netip.AddrPort) datapathFlowKey {
	k := datapathFlowKey{Family: family(local.Addr().Unmap()), Sport: htons(local.Port()), Dport: htons(remote.Port())}
	copy(k.Saddr[:], local.Addr().Unmap().AsSlice())
	copy(k.Daddr[:], remote.Addr().Unmap().AsSlice())
	return k
}

// deleteKeysWhere deletes the entries of m whose key match accepts and
// returns how many it deleted. Keys alone are read (per-CPU values would
// need a slice per entry), all of them before the first delete: deleting
// the key a walk stands on restarts the walk from the first key.
func deleteKeysWhere[K any](m *ebpf.Map, match func(K) bool) (int, error) {
	var doomed []K
	var prev *K // nil: the first key
	for range m.MaxEntries() + 1 {
		var next K
		var err error
		if prev == nil {
			err = m.NextKey(nil, &next)
		} else {
			err = m.NextKey(prev, &next)
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return 0, err
		}
		if match(next) {
			doomed = append(doomed, next)
		}
		prev = &next
	}
	deleted := 0
	for i := range doomed {
		if err := m.Delete(&doomed[i]); err == nil {
			deleted++
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return deleted, err
		}
	}
	return deleted, nil
}
