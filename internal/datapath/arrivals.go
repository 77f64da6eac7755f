package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Each selected pod's SYNs from the wire wait for its answer in an LRU map
// of its own, at its pod slot in arrivals, and the handshakes it answered
// wait for their third ACK in two more, at its slot in answered and
// answered_joins (bpf/datapath.c): a flood of SYNs at one pod, or joins one
// pod answers by the thousand, evict only that pod's, never another pod's
// handshake, whose third ACK would then write no entry (a join's is
// dropped). A slot gets fresh maps when it is given to a pod and loses them
// with the pod; a slot without them stages nothing.

// perPodMaps are the names of the maps of per-pod maps.
var perPodMaps = []string{datapathMapArrivals, datapathMapAnswered, datapathMapAnsweredJoins}

// podMaps are the maps of per-pod maps, by name.
func (d *Datapath) podMaps() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		datapathMapArrivals:      d.objs.Arrivals,
		datapathMapAnswered:      d.objs.Answered,
		datapathMapAnsweredJoins: d.objs.AnsweredJoins,
	}
}

// lruFreeBatch is how many free entries a CPU takes at once from an LRU
// map's common free list before Linux 6.16 (LOCAL_FREE_TARGET). There, a
// map with fewer than two batches per CPU that uses it runs out of free
// entries and evicts live ones early, whatever its fill: each per-pod map
// holds that many on such kernels, up to podMapEntriesMax. From 6.16 the
// batch shrinks with the map ("bpf: Adjust free target to avoid global
// starvation of LRU map").
const lruFreeBatch = 128

// podMapEntriesMax bounds a per-pod map's size on kernels before 6.16 (the
// size the node's one map of answered joins had): 16 CPUs' worth, 750 KiB.
const podMapEntriesMax = 4096

// podMapEntries is the size of a per-pod map whose limit is limit, on a
// kernel of that release with cpus possible CPUs.
func podMapEntries(limit uint32, release string, cpus int) uint32 {
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err == nil && (major > 6 || major == 6 && minor >= 16) {
		return limit
	}
	return max(limit, min(uint32(2*lruFreeBatch*cpus), podMapEntriesMax))
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

// kernelRelease is the running kernel's release ("6.18.44-..."), empty if
// unknown.
func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
