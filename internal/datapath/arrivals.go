package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Each selected pod's SYNs from the wire wait for its answer in an LRU map
// of its own, at its pod slot in arrivals (bpf/datapath.c): a flood of SYNs
// at one pod evicts only that pod's waiting SYNs, never another pod's
// waiting join, whose third ACK would then be dropped. A slot gets a fresh
// map when it is given to a pod and loses it with the pod; a slot without
// one stages nothing.

// giveArrivals gives slot an empty map of waiting SYNs.
func (d *Datapath) giveArrivals(slot uint32) error {
	m, err := ebpf.NewMap(d.arrivalsSpec)
	if err != nil {
		return fmt.Errorf("creating the waiting SYNs of pod slot %d: %w", slot, err)
	}
	defer m.Close() // arrivals holds it from here on
	if err := d.objs.Arrivals.Put(slot, m); err != nil {
		return fmt.Errorf("giving pod slot %d its waiting SYNs: %w", slot, err)
	}
	return nil
}

// takeArrivals takes slot's map of waiting SYNs away.
func (d *Datapath) takeArrivals(slot uint32) error {
	if err := d.objs.Arrivals.Delete(slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("taking the waiting SYNs of pod slot %d: %w", slot, err)
	}
	return nil
}

// restoreArrivals gives every selected pod a map of waiting SYNs after a
// load: arrivals is not pinned, and the endpoints are.
func (d *Datapath) restoreArrivals() error {
	var k datapathEndpointKey
	var v datapathEndpoint
	it := d.objs.Endpoints.Iterate()
	for it.Next(&k, &v) {
		if v.PodSlot == 0 || v.PodSlot > MaxPods {
			continue
		}
		if err := d.giveArrivals(v.PodSlot); err != nil {
			return err
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading endpoints: %w", err)
	}
	return nil
}
