package datapath

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// TrafficCounters are bytes and packets a pod sent (Tx) and received (Rx),
// counted at its host-side veth (frame lengths, as skb->len).
type TrafficCounters struct {
	TxPackets, TxBytes, RxPackets, RxBytes uint64
}

// Add adds o to c.
func (c *TrafficCounters) Add(o TrafficCounters) {
	c.TxPackets += o.TxPackets
	c.TxBytes += o.TxBytes
	c.RxPackets += o.RxPackets
	c.RxBytes += o.RxBytes
}

// PodStats returns the record actor's counters per selected pod address:
// every TCP packet the pod sends or receives through its veth, steered or
// not.
func (d *Datapath) PodStats() (map[netip.Addr]TrafficCounters, error) {
	out := map[netip.Addr]TrafficCounters{}
	var k datapathEndpointKey
	var ep datapathEndpoint
	// Through the endpoints: a pod's counters are at the slot its
	// endpoint names, whatever other slot a failed write left behind.
	it := d.objs.Endpoints.Iterate()
	for it.Next(&k, &ep) {
		var perCPU []datapathPodRecord
		if ep.PodSlot == 0 {
			continue // written before slots: it gets one at the next reconcile
		}
		if err := d.objs.PodRecords.Lookup(ep.PodSlot, &perCPU); err != nil {
			return nil, fmt.Errorf("reading pod counters at slot %d: %w", ep.PodSlot, err)
		}
		if len(perCPU) == 0 || perCPU[0].Owner != k {
			continue
		}
		var c TrafficCounters
		for _, v := range perCPU {
			c.Add(TrafficCounters{TxPackets: v.Stats.TxPackets, TxBytes: v.Stats.TxBytes, RxPackets: v.Stats.RxPackets, RxBytes: v.Stats.RxBytes})
		}
		out[addrFrom(k.Family, k.Addr)] = c
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading pod counters: %w", err)
	}
	return out, nil
}

// ConnKey names a connection: the local pod and its token (Connection.Token).
type ConnKey struct {
	Local netip.Addr
	Token uint32
}

// ConnectionStats sums each connection's subflow counters. Only subflows
// still in the table count: a subflow's bytes leave the sum with it.
func (d *Datapath) ConnectionStats() (map[ConnKey]TrafficCounters, error) {
	sfs, err := d.Subflows()
	if err != nil {
		return nil, fmt.Errorf("reading subflows: %w", err)
	}
	out := map[ConnKey]TrafficCounters{}
	for _, sf := range sfs {
		if sf.Conn == 0 {
			continue
		}
		k := ConnKey{Local: sf.Local.Addr(), Token: sf.Conn}
		c := out[k]
		c.Add(sf.Counters)
		out[k] = c
	}
	return out, nil
}

// TableOccupancy is one LRU table's fill and its evictions.
type TableOccupancy struct {
	// Entries live now, and the table's capacity.
	Entries, Capacity int
	// Evictions the kernel's LRU made to fit new entries: entries the
	// programs created, minus those the agent deleted, minus those still
	// live. Exact while nothing else deletes entries; a pinned table
	// carries its counts across agent restarts, since the counters live in
	// the (pinned) stats map.
	Evictions uint64
}

// Occupancy returns the fill and evictions of the subflow and connection
// tables.
func (d *Datapath) Occupancy() (subflows, conns TableOccupancy, err error) {
	st, err := d.Stats()
	if err != nil {
		return subflows, conns, err
	}
	if subflows, err = occupancy(d.objs.Subflows, st[StatSubflowInsert], st[StatSubflowForgotten]); err != nil {
		return subflows, conns, fmt.Errorf("subflow table: %w", err)
	}
	if conns, err = occupancy(d.objs.ConnStates, st[StatConnInsert], st[StatConnForgotten]); err != nil {
		return subflows, conns, fmt.Errorf("connection table: %w", err)
	}
	return subflows, conns, nil
}

func occupancy(m *ebpf.Map, inserts, forgotten uint64) (TableOccupancy, error) {
	o := TableOccupancy{Capacity: int(m.MaxEntries())}
	key := make([]byte, m.KeySize())
	it := m.Iterate()
	value := make([]byte, m.ValueSize())
	for it.Next(&key, &value) {
		o.Entries++
	}
	if err := it.Err(); err != nil {
		return o, err
	}
	if gone := forgotten + uint64(o.Entries); inserts > gone {
		o.Evictions = inserts - gone
	}
	return o, nil
}

// countForgotten adds n to a counter the agent owns (CPU 0's slot of the
// per-CPU stats map; programs never write these ids).
func (d *Datapath) countForgotten(id Stat, n uint64) error {
	var perCPU []uint64
	if err := d.objs.Stats.Lookup(uint32(id), &perCPU); err != nil {
		return err
	}
	perCPU[0] += n
	return d.objs.Stats.Put(uint32(id), perCPU)
}
