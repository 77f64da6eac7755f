package datapath

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
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
	StatMPTCPOptInvalid  = datapathStatIdSTAT_MPTCP_OPT_INVALID
	// StatObserved counts, in observe-only mode, the packets that would
	// have been given a path mark (StatMarked otherwise).
	StatObserved = datapathStatIdSTAT_OBSERVED
	// StatNoRuleMatch: an opening SYN of a selected pod that none of its
	// rules selects (left unplaced).
	StatNoRuleMatch = datapathStatIdSTAT_NO_RULE_MATCH
	// StatPathDownSkipped: a placement passed over a path marked down.
	StatPathDownSkipped = datapathStatIdSTAT_PATH_DOWN_SKIPPED
	// StatAllPathsDown: a subflow left unplaced because every path of its
	// rule is down.
	StatAllPathsDown = datapathStatIdSTAT_ALL_PATHS_DOWN
	// StatSubflowInsert and StatConnInsert count entries created in the
	// subflow and connection tables (the connection table's LRU
	// evictions are derived from them).
	StatSubflowInsert = datapathStatIdSTAT_SUBFLOW_INSERT
	StatConnInsert    = datapathStatIdSTAT_CONN_INSERT
	// StatSubflowEvicted and StatPoliceEvicted count entries of the
	// subflow table and of the police buckets evicted from a full bucket.
	StatSubflowEvicted = datapathStatIdSTAT_SUBFLOW_EVICTED
	StatPoliceEvicted  = datapathStatIdSTAT_POLICE_EVICTED
	// StatMapUpdateFailed: a table update that was not stored.
	StatMapUpdateFailed = datapathStatIdSTAT_MAP_UPDATE_FAILED
	// StatSubflowForgotten and StatConnForgotten count the agent's own
	// deletions (ForgetSubflow, ForgetConnection).
	StatSubflowForgotten = datapathStatIdSTAT_SUBFLOW_FORGOTTEN
	StatConnForgotten    = datapathStatIdSTAT_CONN_FORGOTTEN
	// Rate actor (rate.go): police drops by the bucket that refused the
	// packet, window rewrites, ACKs left alone for want of the handshake,
	// packets classified for shaping.
	StatRateDropConn   = datapathStatIdSTAT_RATE_DROP_CONN
	StatRateDropPod    = datapathStatIdSTAT_RATE_DROP_POD
	StatRateDropPath   = datapathStatIdSTAT_RATE_DROP_PATH
	StatRateWndLowered = datapathStatIdSTAT_RATE_WND_LOWERED
	StatRateNoWscale   = datapathStatIdSTAT_RATE_NO_WSCALE
	StatRateShaped     = datapathStatIdSTAT_RATE_SHAPED
	// StatBackupFlagged: the backup actor set the B bit of a join, or of
	// an MP_PRIO, going into a pod on a backup path.
	StatBackupFlagged = datapathStatIdSTAT_BACKUP_FLAGGED
	// StatBackupPrioSent: an MP_PRIO added to a pure ACK going into a pod
	// whose subflow's path changed role; StatBackupPrioNoRoom: one was due
	// but the ACK's options left no room the pod reads (full, or ended
	// early by an EOL or a broken option).
	StatBackupPrioSent   = datapathStatIdSTAT_BACKUP_PRIO_SENT
	StatBackupPrioNoRoom = datapathStatIdSTAT_BACKUP_PRIO_NO_ROOM
	// StatAddAddrBlocked: an ADD_ADDR going into a pod whose rule allows
	// no join was turned into NOPs.
	StatAddAddrBlocked = datapathStatIdSTAT_ADD_ADDR_BLOCKED
	// StatJoinRefused: a peer's join beyond its rule's maximum, answered
	// with a reset carrying MP_TCPRST "administratively prohibited".
	StatJoinRefused = datapathStatIdSTAT_JOIN_REFUSED
	// Failover (bpf/include/detour.h): a subflow whose path is down on
	// this node sent over another path of its rule (Detoured), brought
	// back to its own once that came up (Homed), and moved onto the path
	// the peer's packets arrive over, or back (Followed).
	StatSubflowDetoured = datapathStatIdSTAT_SUBFLOW_DETOURED
	StatSubflowHomed    = datapathStatIdSTAT_SUBFLOW_HOMED
	StatSubflowFollowed = datapathStatIdSTAT_SUBFLOW_FOLLOWED
	// StatSubflowClosed: a subflow the pod's kernel closed gave its path
	// and its count back to its connection (SubflowClosed).
	StatSubflowClosed = datapathStatIdSTAT_SUBFLOW_CLOSED
	// StatArrivalStaged: a SYN from the wire, held until the pod answers
	// it and the peer's third ACK acknowledges the answer, which writes
	// the entry (StatSubflowMirrored); StatArrivalPromoted: one acked on a
	// 4-tuple whose old entry then went, and whose entry it became. Staged
	// beyond mirrored and promoted is SYNs to closed ports, forged ones,
	// or handshakes that never completed.
	StatArrivalStaged   = datapathStatIdSTAT_ARRIVAL_STAGED
	StatArrivalPromoted = datapathStatIdSTAT_ARRIVAL_PROMOTED
	// StatAnswerDropped: a pod's join SYN-ACK on a live subflow's 4-tuple
	// answered no SYN the datapath saw (its arrival was replaced or never
	// staged), and was dropped rather than let a join complete uncounted.
	StatAnswerDropped = datapathStatIdSTAT_ANSWER_DROPPED
	// StatJoinACKDropped: a peer's third ACK of a join to a selected pod
	// whose 4-tuple had neither an entry nor an answered arrival (lost to
	// a restart of the agent), dropped rather than let the join complete
	// uncounted (in observe-only mode: passed).
	StatJoinACKDropped = datapathStatIdSTAT_JOIN_ACK_DROPPED
	// StatPodSubflowsFull: a new subflow of a pod that holds
	// limits.PodSubflows entries of the subflow table: a connection left
	// unplaced, a join refused (the pod's or a peer's, with MP_TCPRST at
	// its SYN; a peer's answered before the pod filled, its third ACK
	// dropped).
	StatPodSubflowsFull = datapathStatIdSTAT_POD_SUBFLOWS_FULL
	// StatTCPOptsCut: a segment whose TCP option list a broken option
	// (length 0 or 1, past the header, or a kind without its length) ends
	// before the header does: read up to it, as the kernel reads it.
	StatTCPOptsCut = datapathStatIdSTAT_TCP_OPTS_CUT
	// StatMPTCPOptsAmbiguous: a segment to or from a selected pod whose
	// MPTCP options the pod's kernel could read otherwise than the
	// datapath (an MPTCP option of length 2; MP_CAPABLE, MP_JOIN, DSS or
	// ADD_ADDR more than once; MP_JOIN with MP_PRIO), dropped (in
	// observe-only mode: passed).
	StatMPTCPOptsAmbiguous = datapathStatIdSTAT_MPTCP_OPTS_AMBIGUOUS
	// StatLivenessRefused: a datagram to the liveness port of one of the
	// node's path addresses from no peer's prober on that path, dropped
	// before the agent's socket (in observe-only mode: passed).
	StatLivenessRefused = datapathStatIdSTAT_LIVENESS_REFUSED
	// StatUnreadableTCPDropped: a fragment of a TCP segment to or from a
	// selected pod, or an IPv6 packet whose extension headers run past
	// the parser's bound, whose options the datapath cannot read and the
	// pod's kernel would obey, dropped (in observe-only mode: passed).
	StatUnreadableTCPDropped = datapathStatIdSTAT_UNREADABLE_TCP_DROPPED
	// StatEdgeSteered: a subflow's packet that a CNI sent out of another
	// NIC than its path's, past the policy routing its mark selects,
	// redirected to its path's NIC (SetPathNIC).
	StatEdgeSteered = datapathStatIdSTAT_EDGE_STEERED
	// StatForeign4TupleDropped: a packet on a live subflow's 4-tuple that
	// entered the node by another pod's interface, dropped (in
	// observe-only mode: passed).
	StatForeign4TupleDropped = datapathStatIdSTAT_FOREIGN_4TUPLE_DROPPED
	// StatTunnelSteered: an overlay's outer packet carrying a subflow of
	// another path than its NIC's, readdressed to the peer's address on
	// that path and redirected to its NIC (SyncTunnelHops).
	StatTunnelSteered = datapathStatIdSTAT_TUNNEL_STEERED
	numStats          = int(datapathStatIdSTAT_MAX)
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

// MPTCPSubtype is an MPTCP option subtype (RFC 8684 section 3, the IANA
// "MPTCP Option Subtypes" registry): the high nibble of the option's third
// byte.
type MPTCPSubtype uint8

// The subtypes RFC 8684 defines, and the experimental one.
const (
	MPCapable      MPTCPSubtype = 0x0 // 3.1
	MPJoin         MPTCPSubtype = 0x1 // 3.2
	DSS            MPTCPSubtype = 0x2 // 3.3
	AddAddr        MPTCPSubtype = 0x3 // 3.4.1
	RemoveAddr     MPTCPSubtype = 0x4 // 3.4.2
	MPPrio         MPTCPSubtype = 0x5 // 3.3.8
	MPFail         MPTCPSubtype = 0x6 // 3.7
	MPFastclose    MPTCPSubtype = 0x7 // 3.5
	MPTCPRst       MPTCPSubtype = 0x8 // 3.6
	MPExperimental MPTCPSubtype = 0xf
	// NumMPTCPSubtypes is how many values the 4-bit field can take.
	NumMPTCPSubtypes = 16
)

var subtypeNames = map[MPTCPSubtype]string{
	MPCapable: "MP_CAPABLE", MPJoin: "MP_JOIN", DSS: "DSS", AddAddr: "ADD_ADDR", RemoveAddr: "REMOVE_ADDR",
	MPPrio: "MP_PRIO", MPFail: "MP_FAIL", MPFastclose: "MP_FASTCLOSE", MPTCPRst: "MP_TCPRST", MPExperimental: "MP_EXPERIMENTAL",
}

// Named says whether RFC 8684 (or the IANA registry) names the subtype.
func (s MPTCPSubtype) Named() bool {
	_, ok := subtypeNames[s]
	return ok
}

func (s MPTCPSubtype) String() string {
	if n, ok := subtypeNames[s]; ok {
		return n
	}
	return fmt.Sprintf("subtype-%#x", uint8(s))
}

// SubtypeCounters count, for one MPTCP subtype, the packets the datapath
// parsed that carried it.
type SubtypeCounters struct {
	// Packets carried a valid option of the subtype (counted once per
	// packet even when the packet repeats the subtype).
	Packets uint64
	// Invalid carried one whose length RFC 8684 does not define for the
	// subtype (and the segment): the datapath ignored the option, as the
	// receiver does.
	Invalid uint64
}

// MPTCPOptionStats returns the record actor's per-subtype counters, summed
// over CPUs and indexed by subtype. They cover every TCP packet the
// programs parse, selected pods or not: pod_egress on the veths it is
// attached to, nic_ingress on the path NICs.
func (d *Datapath) MPTCPOptionStats() ([NumMPTCPSubtypes]SubtypeCounters, error) {
	var out [NumMPTCPSubtypes]SubtypeCounters
	for i := range out {
		var perCPU []datapathMptcpSubtypeStats
		if err := d.objs.MptcpOptions.Lookup(uint32(i), &perCPU); err != nil {
			return out, fmt.Errorf("reading MPTCP option counters of %v: %w", MPTCPSubtype(i), err)
		}
		for _, v := range perCPU {
			out[i].Packets += v.Packets
			out[i].Invalid += v.Invalid
		}
	}
	return out, nil
}

// PathCounters are the bytes and packets the datapath steered per path.
type PathCounters struct {
	TxPackets, TxBytes, RxPackets, RxBytes uint64
}

// PathStats returns the counters of every path, indexed by the path's index
// (entry 0, no path, stays zero).
func (d *Datapath) PathStats() ([]PathCounters, error) {
	out := make([]PathCounters, MaxPaths+1)
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

// Role says which side of a subflow this node is on: enum subflow_role.
type Role uint32

const (
	// RoleInitiator: a local pod opened the subflow and this node chose its path.
	RoleInitiator = Role(datapathSubflowRoleROLE_INITIATOR)
	// RoleResponder: a peer opened it; this node mirrors the arrival NIC.
	RoleResponder = Role(datapathSubflowRoleROLE_RESPONDER)
)

// Subflow is one entry of the subflow table, seen from the local pod.
type Subflow struct {
	Local, Remote netip.AddrPort
	Path          uint32
	// Detour is the path the subflow travels instead of Path while Path
	// is down on one of the two nodes (bpf/include/detour.h); 0: none.
	Detour uint32
	Role   Role
	Token  uint32
	// Rule selected the subflow; NoRule when none did (a mirrored one).
	Rule uint32
	// CreatedNs is when the subflow was placed or mirrored, on the
	// kernel's monotonic clock (bpf_ktime_get_ns).
	CreatedNs uint64
	// Conn is its connection's token (Connection.Token), 0 until known.
	Conn uint32
	// Bytes and packets the pod sent (Tx) and received (Rx) on it.
	Counters TrafficCounters
}

// The SUBFLOW_DETOUR bits of a subflow's flags (bpf/include/common.h).
const (
	subflowDetourShift = 8
	subflowDetourMask  = 0xf << subflowDetourShift
)

// NoRule is the Rule of a subflow no rule selected.
const NoRule = ruleNone

// Subflows lists the subflow table.
func (d *Datapath) Subflows() ([]Subflow, error) {
	return subflowsIn(d.objs.Subflows)
}

// subflowsIn lists a subflow table laid out as this release's.
func subflowsIn(m *ebpf.Map) ([]Subflow, error) {
	entries, err := subflowEntries(m)
	if err != nil {
		return nil, err
	}
	out := make([]Subflow, 0, len(entries))
	for _, e := range entries {
		out = append(out, subflowOf(e.Key, e.Value))
	}
	return out, nil
}

func subflowOf(k datapathFlowKey, v datapathSubflow) Subflow {
	return Subflow{
		Local:     netip.AddrPortFrom(addrFrom(k.Family, k.Saddr), ntohs(k.Sport)),
		Remote:    netip.AddrPortFrom(addrFrom(k.Family, k.Daddr), ntohs(k.Dport)),
		Path:      v.PathIndex,
		Detour:    (v.Flags & subflowDetourMask) >> subflowDetourShift,
		Role:      Role(v.Role),
		Token:     v.Token,
		Rule:      v.Rule,
		Conn:      v.Conn,
		CreatedNs: v.CreatedNs,
		Counters: TrafficCounters{TxPackets: v.TxPackets, TxBytes: v.TxBytes,
			RxPackets: v.RxPackets, RxBytes: v.RxBytes},
	}
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
	// Subflows counts the initial subflow and the peer's joins this node
	// let in.
	Subflows uint32
	// Rule is the rule of its initial subflow, which its joins follow.
	Rule uint32
}

// Connections lists the connection table.
func (d *Datapath) Connections() ([]Connection, error) {
	var out []Connection
	var k datapathConnKey
	var v datapathConn
	it := d.objs.ConnStates.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Connection{Local: addrFrom(k.Family, k.Local), Token: k.Token, UsedPaths: v.Used, Joins: v.Joins, Subflows: v.Subflows, Rule: v.Rule})
	}
	return out, it.Err()
}

// ntohs turns a port stored in network byte order into a number.
func ntohs(p uint16) uint16 { return p>>8 | p<<8 }
