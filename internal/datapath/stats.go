package datapath

import (
	"net/netip"
)

// Stat names a datapath counter.
type Stat = datapathStatId

// The datapath's counters; see enum stat_id in bpf/include/common.h.
const (
	StatPackets          = datapathStatIdSTAT_PACKETS
	StatNotTCP           = datapathStatIdSTAT_NOT_TCP
	StatMalformed        = datapathStatIdSTAT_MALFORMED
	StatMPTCPSyn         = datapathStatIdSTAT_MPTCP_SYN
	StatJoinSyn          = datapathStatIdSTAT_JOIN_SYN
	StatJoinTokenKnown   = datapathStatIdSTAT_JOIN_TOKEN_KNOWN
	StatJoinTokenUnknown = datapathStatIdSTAT_JOIN_TOKEN_UNKNOWN
	StatTokenLearnt      = datapathStatIdSTAT_TOKEN_LEARNT
	StatSubflowPlaced    = datapathStatIdSTAT_SUBFLOW_PLACED
	StatSubflowMirrored  = datapathStatIdSTAT_SUBFLOW_MIRRORED
	StatMarked           = datapathStatIdSTAT_MARKED
	StatNoPath           = datapathStatIdSTAT_NO_PATH
	StatPathsExhausted   = datapathStatIdSTAT_PATHS_EXHAUSTED
	numStats             = int(datapathStatIdSTAT_MAX)
)

// Stats returns every counter summed over CPUs.
func (d *Datapath) Stats() (map[Stat]uint64, error) {
	out := make(map[Stat]uint64, numStats)
	for i := 0; i < numStats; i++ {
		var perCPU []uint64
		if err := d.objs.Stats.Lookup(uint32(i), &perCPU); err != nil {
			return nil, err
		}
		var sum uint64
		for _, v := range perCPU {
			sum += v
		}
		out[Stat(i)] = sum
	}
	return out, nil
}

// PathCounters are the bytes and packets the datapath steered per path.
type PathCounters struct {
	TxPackets, TxBytes, RxPackets, RxBytes uint64
}

// PathStats returns the counters of every path index.
func (d *Datapath) PathStats() ([]PathCounters, error) {
	out := make([]PathCounters, MaxPaths)
	for p := range out {
		var perCPU []datapathPathStats
		if err := d.objs.PathCounters.Lookup(uint32(p), &perCPU); err != nil {
			return nil, err
		}
		for _, v := range perCPU {
			out[p].TxPackets += v.TxPackets
			out[p].TxBytes += v.TxBytes
			out[p].RxPackets += v.RxPackets
			out[p].RxBytes += v.RxBytes
		}
	}
	return out, nil
}

// Role says which side of a subflow this node is on.
type Role uint32

const (
	// RoleInitiator: a local pod opened the subflow and this node chose its path.
	RoleInitiator Role = 1
	// RoleResponder: a peer opened it; this node mirrors the arrival NIC.
	RoleResponder Role = 2
)

// Subflow is one entry of the subflow table, seen from the local pod.
type Subflow struct {
	Local, Remote netip.AddrPort
	Path          uint32
	Role          Role
	Token         uint32
}

// Subflows lists the subflow table.
func (d *Datapath) Subflows() ([]Subflow, error) {
	var out []Subflow
	var k datapathFlowKey
	var v datapathSubflow
	it := d.objs.Subflows.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Subflow{
			Local:  netip.AddrPortFrom(addrFrom(k.Family, k.Saddr), ntohs(k.Sport)),
			Remote: netip.AddrPortFrom(addrFrom(k.Family, k.Daddr), ntohs(k.Dport)),
			Path:   v.Path,
			Role:   Role(v.Role),
			Token:  v.Token,
		})
	}
	return out, it.Err()
}

// Connection is a connection as this node knows it, keyed by the local pod
// and the responder's token.
type Connection struct {
	Local netip.Addr
	Token uint32
	// UsedPaths has bit p set when a subflow of the connection is on path p.
	UsedPaths uint32
	// Joins is how many joins this node placed.
	Joins uint32
}

// Connections lists the connection table.
func (d *Datapath) Connections() ([]Connection, error) {
	var out []Connection
	var k datapathConnKey
	var v datapathConn
	it := d.objs.ConnStates.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Connection{Local: addrFrom(k.Family, k.Local), Token: k.Token, UsedPaths: v.Used, Joins: v.Joins})
	}
	return out, it.Err()
}

// ntohs turns a port stored in network byte order into a number.
func ntohs(p uint16) uint16 { return p>>8 | p<<8 }
