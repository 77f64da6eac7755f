package datapath

import (
	"fmt"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// The programs keep, per pod slot, how many entries of the subflow table
// carry it (pod_subflows), and place no new subflow of a pod that holds
// limits.PodSubflows (docs/datapath.md, "Entries per pod"). Load counts
// them again from the table, as the agent does after its first reconcile
// and then at most every minute, at reconciles and sweeps: the table may
// have been filled by a migration, or written by the programs of a release
// that did not count until the agent attached its own, and a count that
// drifted (writes of the programs racing each other or user space, or this
// count) does not stay off.

// RecountPodSubflows writes into pod_subflows how many live ways of the
// subflow table carry each pod slot. Every way counts, an entry two CPUs
// stored at once twice, as the programs counted it and as a delete takes
// it back. Programs writing the table meanwhile may leave a count off by
// their writes during the read, until the next count.
func (d *Datapath) RecountPodSubflows() error {
	counts := make([]uint32, limits.Pods+1)
	err := readTable(d.objs.Subflows, subflowWays, func(e *datapathSubflowEntry) {
		if slot := e.Value.PodSlot; slot != 0 && int(slot) <= limits.Pods {
			counts[slot]++
		}
	})
	if err != nil {
		return fmt.Errorf("counting the subflow entries of each pod: %w", err)
	}
	keys := make([]uint32, len(counts))
	for i := range keys {
		keys[i] = uint32(i)
	}
	if _, err := d.objs.PodSubflows.BatchUpdate(keys, counts, nil); err != nil {
		return fmt.Errorf("writing the subflow entries of each pod: %w", err)
	}
	return nil
}

// PodSubflows returns how many entries of the subflow table the programs
// count for each pod slot that has any.
func (d *Datapath) PodSubflows() (map[uint32]uint32, error) {
	out := map[uint32]uint32{}
	var slot, n uint32
	it := d.objs.PodSubflows.Iterate()
	for it.Next(&slot, &n) {
		if n != 0 {
			out[slot] = n
		}
	}
	return out, it.Err()
}
