package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Each selected pod's SYNs from the wire wait for its answer in an LRU map
// of its own, at its pod slot in arrivals, and the joins it answered wait
// for their third ACK in another, at its slot in answered_joins
// (bpf/datapath.c): a flood of SYNs at one pod, or joins one pod answers
// by the thousand, evict only that pod's, never another pod's join, whose
// third ACK would then be dropped. A slot gets fresh maps when it is given
// to a pod and loses them with the pod; a slot without them stages nothing.

// podMaps are the outer maps of per-pod maps and the spec of their inner
// maps, by the outer map's name.
func (d *Datapath) podMaps() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{datapathMapArrivals: d.objs.Arrivals, datapathMapAnsweredJoins: d.objs.AnsweredJoins}
}

// givePodMaps gives slot empty maps of waiting SYNs and answered joins.
func (d *Datapath) givePodMaps(slot uint32) error {
	for name, outer := range d.podMaps() {
		m, err := ebpf.NewMap(d.podMapSpecs[name])
		if err != nil {
			return fmt.Errorf("creating the %s of pod slot %d: %w", name, slot, err)
		}
		err = outer.Put(slot, m)
		_ = m.Close() // the outer map holds it from here on
		if err != nil {
			return fmt.Errorf("giving pod slot %d its %s: %w", slot, name, err)
		}
	}
	return nil
}

// takePodMaps takes slot's maps of waiting SYNs and answered joins away.
func (d *Datapath) takePodMaps(slot uint32) error {
	for name, outer := range d.podMaps() {
		if err := outer.Delete(slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("taking the %s of pod slot %d: %w", name, slot, err)
		}
	}
	return nil
}

// restorePodMaps gives every selected pod its maps after a load: the
// outer maps are not pinned, and the endpoints are.
func (d *Datapath) restorePodMaps() error {
	var k datapathEndpointKey
	var v datapathEndpoint
	it := d.objs.Endpoints.Iterate()
	for it.Next(&k, &v) {
		if v.PodSlot == 0 || v.PodSlot > MaxPods {
			continue
		}
		if err := d.givePodMaps(v.PodSlot); err != nil {
			return err
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading endpoints: %w", err)
	}
	return nil
}
