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

// TableOccupancy is one table's fill and its evictions.
type TableOccupancy struct {
	// Entries live now, of Capacity.
	Entries, Capacity int
	// Evictions is how many entries were pushed out to make room, since
	// the table was created. It carries its counts across agent restarts,
	// since the counters live in the (pinned) stats map.
	Evictions uint64
}

// Occupancy returns the fill and evictions of the datapath's tables, by
// name: "subflows", "connections" (an LRU map, whose evictions are derived
// from its inserts, deletions and fill) and "police_buckets".
func (d *Datapath) Occupancy() (map[string]TableOccupancy, error) {
	st, err := d.Stats()
	if err != nil {
		return nil, err
	}
	out := map[string]TableOccupancy{}
	var live int
	if err := readTable(d.objs.Subflows, subflowWays, func(*datapathSubflowEntry) { live++ }); err != nil {
		return nil, fmt.Errorf("subflow table: %w", err)
	}
	out["subflows"] = TableOccupancy{Entries: live, Capacity: tableCapacity(d.objs.Subflows), Evictions: st[StatSubflowEvicted]}
	live = 0
	if err := readTable(d.objs.RateBuckets, policeWays, func(*datapathPoliceEntry) { live++ }); err != nil {
		return nil, fmt.Errorf("police buckets: %w", err)
	}
	out["police_buckets"] = TableOccupancy{Entries: live, Capacity: tableCapacity(d.objs.RateBuckets), Evictions: st[StatPoliceEvicted]}
	conns, err := lruOccupancy(d.objs.ConnStates, st[StatConnInsert], st[StatConnForgotten])
	if err != nil {
		return nil, fmt.Errorf("connection table: %w", err)
	}
	out["connections"] = conns
	return out, nil
}

// tableCapacity is how many entries a table map holds.
func tableCapacity(m *ebpf.Map) int { return int(m.MaxEntries()) * tableWays }

func lruOccupancy(m *ebpf.Map, inserts, forgotten uint64) (TableOccupancy, error) {
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
