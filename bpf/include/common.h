/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Shared definitions for the mptcp-operator datapath. */
#pragma once

#include <stdbool.h>
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* TCX_NEXT hands the packet to the next program on the hook, so that a CNI's
 * programs still run after ours; with a legacy tc attachment the same value is
 * TC_ACT_UNSPEC, which also continues. Old UAPI headers lack it. */
#ifndef TCX_NEXT
#define TCX_NEXT -1
#endif

/* The limits every layer checks. This is C's definition, once; Go has its own,
 * once (internal/limits), which the agent, the controller and the API use, and
 * TestLimitsAreTheCEnum (internal/datapath) reads this enum from the object's
 * BTF and checks that every value equals Go's. The API's schema states the
 * same numbers in its markers and CEL rules (api/v1alpha1, checked against Go's
 * by TestSchemaLimitsAreTheDatapaths). The API never accepts what an agent
 * would refuse. */
enum limit {
	/* Paths per node. A path's index (MPTCPPath status.index, 1..15) is
	 * the value written in the mark's 4 bits (0: not steered) and the
	 * offset of its routing table: no layer renumbers it. */
	LIMIT_PATHS = 15,
	/* Rule ids, 0..255: entries of the rules and rate_rules arrays. */
	LIMIT_RULES = 256,
	/* A pod's selector chain (struct endpoint). */
	LIMIT_POD_RULES = 8,
	/* Port ranges of one rule's selector (struct rule). */
	LIMIT_RULE_PORTS = 8,
	/* Remote CIDRs of one rule's selector: rule_cidrs holds
	 * LIMIT_RULES * LIMIT_RULE_CIDRS prefixes. */
	LIMIT_RULE_CIDRS = 32,
	/* Subflows of a connection, the first included: the kernel's own cap
	 * (net.mptcp subflows_max and add_addr_accepted stop at 8). */
	LIMIT_SUBFLOWS = 8,
	/* A path's weight in a rule (a byte of struct rule). */
	LIMIT_WEIGHT = 255,
	/* Selected pod addresses (slots of pod_records). */
	LIMIT_PODS = 4096,
	/* Subflow table entries one pod may hold (its slot's count in
	 * pod_subflows): a sixteenth of the table, so that no pod's
	 * connections, nor a flood of handshakes a pod answers, can take the
	 * table from the node's other pods (docs/datapath.md, "Entries per
	 * pod"). */
	LIMIT_POD_SUBFLOWS = 4096,
	/* SYNs from the wire one pod has waiting for its answer (its own
	 * arrivals map): a flood at one pod evicts only that pod's, never
	 * another's waiting join (docs/datapath.md, "A SYN from the wire
	 * writes no entry"). */
	LIMIT_POD_ARRIVALS = 512,
	/* Initial subflows, and joins, one pod answered whose third ACK has
	 * not come yet (its own maps of answered handshakes). */
	LIMIT_POD_ANSWERED = 512,
	LIMIT_POD_ANSWERED_JOINS = 256,
	/* Pairs of a node's path address and a peer's address there that may
	 * send to its liveness port: 15 paths of 1000 peers of 4 addresses,
	 * and the node's own 15 (LIMIT_PROBED_PEERS, the API's
	 * four addresses a path). */
	LIMIT_LIVENESS_PAIRS = 65536,
	/* Pod CIDRs of the node's peers whose paths the probes find down
	 * towards them: 1000 peers of two CIDRs (one per family). */
	LIMIT_PEER_CIDRS = 2048,
	/* Entries of tunnel_hops: for each address a peer has on a path, the
	 * peer's address on each other path and the node's own on the
	 * address's path: 1000 peers (LIMIT_PROBED_PEERS) of one address on
	 * each of 15 paths, 15 x 15 entries each. */
	LIMIT_TUNNEL_HOPS = 262144,
	/* Peers whose liveness the node probes: slots 1..1000 of
	 * peer_traffic (0 unused). */
	LIMIT_PROBED_PEERS = 1000,
	/* A rate bucket's depth (police) or the window granted at once
	 * (window), in bytes. Below the floor a bucket drops whole TSO bursts
	 * and TCP collapses far below its cap (docs/datapath.md, Rate); the
	 * ceiling bounds what a connection may send at once. */
	LIMIT_BURST_MIN_BYTES = 64 << 10,
	LIMIT_BURST_MAX_BYTES = 1 << 30,
};

/* Upper bound of paths per node: a 4-bit mark field numbers them 1..15.
 * Arrays indexed by a path index have MAX_PATHS + 1 entries (0 unused). */
#define MAX_PATHS LIMIT_PATHS

#define AF_INET	 2
#define AF_INET6 10

/* Enums whose values outlive the programs that wrote them, stored in a pinned
 * map as a key, a value or an index, are append-only: every enumerator says
 * its number, a new one takes the next unused number, and a number is never
 * moved nor reused, not even once its enumerator is retired (it stays, renamed
 * if need be). A migration carries such integers across an upgrade or a
 * downgrade as they are, whatever they mean to the other release's programs,
 * so a renumbered value would silently be read as another. They are stat_id,
 * subflow_role and spread_mode (here), mptcp_subtype (parse.h), rate_mode and
 * rate_key_kind (rate.h); TestPinnedEnumValues (internal/datapath) holds each
 * of their values and fails when one moves or a new one is not in it. The
 * others are not stored: enum limit holds sizes, not identities; table_id and
 * table.h's pass only between the agent and table_ctl of the same object; the
 * rest never leave a program run. */

/* Drop/skip reasons and events, counted per CPU in the pinned stats map at
 * their number, and read by the agent (internal/datapath/stats.go, from
 * bpf2go). Append-only, see above. */
enum stat_id {
	STAT_PACKETS = 0,	       /* packets seen by any program */
	STAT_NOT_TCP = 1,	       /* not TCP (or not IP): passed untouched */
	STAT_MALFORMED = 2,	       /* truncated or malformed headers: passed untouched */
	STAT_MPTCP_SYN = 3,	       /* SYN carrying MP_CAPABLE */
	STAT_JOIN_SYN = 4,	       /* SYN carrying MP_JOIN */
	STAT_JOIN_TOKEN_KNOWN = 5,     /* MP_JOIN whose token the datapath already knew */
	STAT_JOIN_TOKEN_UNKNOWN = 6,   /* MP_JOIN for a connection not (yet) known */
	STAT_TOKEN_LEARNT = 7,	       /* connections learnt from the keys of an MP_CAPABLE ACK */
	STAT_SUBFLOW_PLACED = 8,       /* new subflows placed on a path (initiator side) */
	STAT_SUBFLOW_MIRRORED = 9,     /* new subflows recorded at arrival (responder side) */
	STAT_MARKED = 10,	       /* packets given a path mark */
	STAT_NO_PATH = 11,	       /* selected traffic but no usable path configured */
	STAT_PATHS_EXHAUSTED = 12,     /* a join found every path of its rule in use and shares one */
	STAT_MPTCP_OPT_INVALID = 13,   /* packets with an MPTCP option of undefined length: option ignored */
	STAT_OBSERVED = 14,	       /* observe-only: packets that would have been given a path mark */
	STAT_NO_RULE_MATCH = 15,       /* opening SYN of a selected pod that none of its rules selects */
	STAT_PATH_DOWN_SKIPPED = 16,   /* a placement passed over a path marked down */
	STAT_ALL_PATHS_DOWN = 17,      /* selected traffic whose rule has no usable path: left unplaced */
	STAT_SUBFLOW_INSERT = 18,      /* new entries written to subflows, evictions included */
	STAT_CONN_INSERT = 19,	       /* new entries written to conn_states */
	STAT_MAP_UPDATE_FAILED = 20,   /* a subflows/conn_states update that was not stored */
	STAT_SUBFLOW_FORGOTTEN = 21,   /* subflows deleted by the agent (from user space, CPU 0) */
	STAT_CONN_FORGOTTEN = 22,      /* connections deleted by the agent (from user space, CPU 0) */
	STAT_RATE_DROP_CONN = 23,      /* police: dropped, the connection's bucket was empty */
	STAT_RATE_DROP_POD = 24,       /* police: dropped, the pod's bucket was empty */
	STAT_RATE_DROP_PATH = 25,      /* police: dropped, the path's bucket was empty */
	STAT_RATE_WND_LOWERED = 26,    /* window: an ACK's receive window lowered to the cap */
	STAT_RATE_NO_WSCALE = 27,      /* window: handshake not seen, scale unknown, ACK left alone */
	STAT_RATE_SHAPED = 28,	       /* shape: packets given an HTB class at a NIC */
	STAT_BACKUP_FLAGGED = 29,      /* backup: B bit set on a join, or an MP_PRIO, into a pod */
	STAT_BACKUP_PRIO_SENT = 30,    /* backup: MP_PRIO added to a pure ACK to a pod (path role changed) */
	STAT_BACKUP_PRIO_NO_ROOM = 31, /* backup: MP_PRIO due, no room the pod reads in the ACK */
	STAT_ADD_ADDR_BLOCKED = 32,    /* block: ADD_ADDR into a pod whose rule allows no join, made NOPs */
	STAT_JOIN_REFUSED = 33,	     /* block: a peer's join past its rule's maximum, answered by MP_TCPRST */
	STAT_SUBFLOW_EVICTED = 34,   /* subflows evicted from a full bucket of the subflow table */
	STAT_POLICE_EVICTED = 35,    /* police buckets evicted from a full bucket of their table */
	STAT_SUBFLOW_DETOURED = 36,  /* a subflow's path down here: sent over another path of its rule */
	STAT_SUBFLOW_HOMED = 37,     /* ... and back on its own path once that came up again */
	STAT_SUBFLOW_FOLLOWED = 38,  /* a subflow's packets followed the peer's to another path, or back */
	STAT_SUBFLOW_CLOSED = 39,    /* closed subflows whose path and count went back to the connection */
	STAT_ARRIVAL_STAGED = 40,    /* a SYN from the wire, waiting for the pod's answer and peer's ACK */
	STAT_ARRIVAL_PROMOTED = 41,  /* ... acked on a 4-tuple with an entry, which went: the 4-tuple is
					the new one's */
	STAT_ANSWER_DROPPED = 42,    /* a pod's join SYN-ACK on a live 4-tuple for no SYN seen: dropped */
	STAT_JOIN_ACK_DROPPED = 43,  /* a join's third ACK with no entry nor answered arrival: dropped */
	STAT_POD_SUBFLOWS_FULL = 44, /* a new subflow of a pod holding LIMIT_POD_SUBFLOWS entries:
					unplaced, or refused if a join */
	STAT_TCP_OPTS_CUT = 45,	     /* a broken option ends the option list: read up to it, as
					the kernel reads it */
	STAT_MPTCP_OPTS_AMBIGUOUS = 46,	  /* MPTCP options the kernel could read otherwise: dropped,
					     to or from a selected pod */
	STAT_LIVENESS_REFUSED = 47,	  /* a datagram to the liveness port of a node's path address
					     from no peer's prober there: dropped */
	STAT_UNREADABLE_TCP_DROPPED = 48, /* a fragment of TCP, or IPv6 past the header bound, to or
					   from a selected pod: dropped */
	STAT_EDGE_STEERED = 49,		  /* a subflow's packet that a CNI sent out of another NIC than
					     its path's: redirected to its path's NIC */
	STAT_FOREIGN_4TUPLE_DROPPED = 50, /* a packet on a live subflow's 4-tuple from another pod's
					     interface: dropped */
	STAT_TUNNEL_STEERED = 51,	  /* an overlay's outer packet carrying a subflow of another
					     path than its NIC's: readdressed to the peer there */
	/* Not an identity: one past the highest, however many there are. */
	STAT_MAX,
};

/* Entries of the stats map: fixed, with room to spare, so that a counter
 * added by a later release does not change the layout of the pinned map a
 * running datapath uses (a pinned map whose size differs cannot be reused). */
#define STATS_CAPACITY 64
_Static_assert(STAT_MAX <= STATS_CAPACITY, "enum stat_id outgrew the stats map");

/* Runtime switches, in the one entry of the settings map. The agent rewrites
 * the entry; programs read it when they are about to act on a packet. The
 * value keeps spare room: a pinned map whose value size differs cannot be
 * reused, so a switch added later takes a bit or a reserved word. */
enum setting_flag {
	SETTING_OBSERVE_ONLY = 1U << 0, /* record everything, write no mark */
};

struct settings_value {
	__u32 flags; /* enum setting_flag */
	/* UDP port of the agents' liveness probes (host order), 0: none.
	 * nic_ingress marks them with their NIC's path, as it marks pods'
	 * packets, so that strict reverse-path filtering accepts them. */
	__u16 liveness_port;
	/* UDP port of the overlay's tunnel (VXLAN, Geneve; host order), 0:
	 * none. nic_ingress marks what arrives to it and to tunnel_local on a
	 * path NIC with the NIC's path: decapsulation keeps the mark on the
	 * inner packet. */
	__u16 tunnel_port;
	/* The node's shaping device (an ifb holding the pods' and namespaces'
	 * HTB classes, rate.h), 0: none. */
	__u32 shape_ifindex;
	/* The tunnel's own address (its VTEP; IPv4 in the first 4 bytes) and
	 * its family (AF_INET, AF_INET6; 0: none, nothing is marked): outer
	 * packets to any other address, forwarded ones, keep no path. */
	__u8 tunnel_local[16];
	__u32 tunnel_family;
	__u32 reserved[8];
};

/* A subflow's 4-tuple as the local pod sends it: saddr/sport are the pod's.
 * IPv4 addresses use the first 4 bytes, the rest is zero. */
struct flow_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 family;
	__u8 pad[3];
} __attribute__((aligned(8))); /* addresses are copied and compared by word */

/* Stored in struct subflow (the pinned subflow table): append-only (see enum
 * stat_id). */
enum subflow_role {
	ROLE_INITIATOR = 1, /* the local pod opened it; this node chose the path */
	ROLE_RESPONDER = 2, /* a remote peer opened it; this node mirrors its arrival NIC */
};

/* No rule selected the subflow (a responder-side subflow is mirrored all the
 * same, so the pod's replies leave by the NIC the peer chose). */
#define RULE_NONE 0xffffffffU

/* The pod's kernel holds the subflow as backup: its join came in flagged B,
 * or an MP_PRIO said so since (backup actor). */
#define SUBFLOW_BACKUP (1U << 0)
/* ... and it holds it because of this datapath: the backup actor set the B
 * bit of its join or sent the MP_PRIO that made it backup. Without the
 * header-rewriting opt-in the actor takes back only what it did. */
#define SUBFLOW_BACKUP_BY_US (1U << 1)
/* Failover (detour.h). The subflow travels a path other than its own, the
 * one in the SUBFLOW_DETOUR bits (0: its own). SUBFLOW_DETOUR_OURS: this node
 * chose the detour because the subflow's path is down here; otherwise the
 * detour follows the peer's, whose packets arrive over that path. */
#define SUBFLOW_DETOUR_OURS (1U << 2)
/* What the subflow took from its connection's entry when it was placed,
 * mirrored or learnt (SUBFLOW_COUNTED: one of the connection's joins or
 * subflows; SUBFLOW_OWNS_PATH: its path's bit, set by it, not shared), and
 * that it gave back when the pod's kernel closed it (SUBFLOW_CLOSED,
 * datapath.c, subflow_closed): only what was taken goes back, once. */
#define SUBFLOW_CLOSED	     (1U << 3)
#define SUBFLOW_COUNTED	     (1U << 4)
#define SUBFLOW_OWNS_PATH    (1U << 5)
#define SUBFLOW_DETOUR_SHIFT 8
#define SUBFLOW_DETOUR_MASK  (0xfU << SUBFLOW_DETOUR_SHIFT)
_Static_assert(MAX_PATHS <= 0xf, "a path index outgrew the SUBFLOW_DETOUR bits");

struct subflow {
	/* The path's index, 1..MAX_PATHS, as the API numbers it. Releases
	 * before 2026-12 kept a 0-based "path" here: the new name tells a
	 * migration which numbering a pinned map holds (migrate_paths.go). */
	__u32 path_index;
	__u32 role;  /* enum subflow_role */
	__u32 token; /* MP_JOIN token (receiver's), 0 for the initial subflow */
	__u32 rule;  /* the rule that selected it: actors read their data there */
	__u64 created_ns;
	/* Record actor. conn is the connection's conn_states token once known
	 * (0 before), so user space sums a connection's bytes over its
	 * subflows. Counted at the pod's veth with atomic adds: a subflow's
	 * packets mostly stay on one CPU, so the cache line rarely moves. */
	__u32 conn;
	__u32 flags;	  /* SUBFLOW_*, set by actors */
	__u64 tx_packets; /* sent by the pod */
	__u64 tx_bytes;
	__u64 rx_packets; /* received by the pod */
	__u64 rx_bytes;
	/* The local pod's slot in pod_records (its endpoint's), so that its
	 * counters need no lookup by address; 0 until known. */
	__u32 pod_slot;
	/* Failover (detour.h), bpf_ktime_get_ns() in milliseconds
	 * (wrapping): when a packet last arrived over the path the subflow
	 * travels now, and when it last changed path. */
	__u32 seen_ms;
	__u32 moved_ms;
	/* A responder's entry: the sequence number of the SYN that opened
	 * it (host order), so that a SYN repeated by its sender is told
	 * from a new one with the same 4-tuple. 0 on the initiator's. */
	__u32 syn_seq;
};

/* subflow_path is the path a subflow's packets travel now: its detour while
 * it has one (detour.h), else its own. What is charged per path (police) is
 * charged to this one. */
static __always_inline __u32 subflow_path(const struct subflow *sf)
{
	__u32 detour = (sf->flags & SUBFLOW_DETOUR_MASK) >> SUBFLOW_DETOUR_SHIFT;

	return detour ? detour : sf->path_index;
}

/* A connection is known on both nodes by both of its tokens: joins the
 * initiator opens carry the responder's token, joins the responder opens carry
 * the initiator's. Both map, through conn_aliases, to one conn_states entry
 * keyed by the responder's token. The local pod's address is part of the key
 * so that tokens of different pods never collide. */
struct conn_key {
	__u8 local[16];
	__u32 token;
	__u8 family;
	__u8 pad[3];
} __attribute__((aligned(8)));

struct conn_alias {
	__u32 canonical; /* the responder's token: the conn_states key */
	__u32 pad;
};

struct conn {
	__u32 used;	/* bit p set: a subflow of the connection is on path p; atomic */
	__u32 joins;	/* joins this node placed; atomic */
	__u32 rule;	/* the rule of its initial subflow: joins follow it, never re-select */
	__u32 subflows; /* the initial subflow and the peer's joins this node let in; atomic (block) */
};

/* A local pod address that rules select. */
struct endpoint_key {
	__u8 addr[16];
	__u8 family;
	__u8 pad[3];
} __attribute__((aligned(4))); /* 20 bytes: word-aligned, not 8 */

/* Rules per pod: the pod's selector chain, tried in order. */
#define MAX_POD_RULES LIMIT_POD_RULES

struct endpoint {
	__u32 nrules;
	__u32 flags;
	__u32 rules[MAX_POD_RULES]; /* rule ids, highest priority first */
	__u32 pod_slot;		    /* the pod's index in pod_records, 0: none (yet) */
};

/* Rule ids index the rules array map; other actors key their own maps by the
 * same id. */
#define MAX_RULES LIMIT_RULES

/* Port ranges a rule's selector holds (an empty list selects every port). */
#define MAX_RULE_PORTS LIMIT_RULE_PORTS

struct port_range {
	__u16 first; /* host byte order, inclusive */
	__u16 last;
};

/* rule.match: which opening SYNs the rule selects. Joins of a connection the
 * datapath knows never reach selection: they follow their connection. */
enum rule_match {
	MATCH_INITIAL = 1U << 0, /* MP_CAPABLE SYN: a new connection */
	MATCH_JOIN = 1U << 1,	 /* MP_JOIN SYN of a connection not (yet) known */
};

/* rule.flags */
enum rule_flag {
	RULE_CIDRS = 1U << 0,		/* remote address must be in rule_cidrs under this rule id */
	RULE_REWRITE_HEADERS = 1U << 1, /* the admin allowed rewriting the pods' headers (backup) */
	RULE_SHARED_RISK = 1U << 2,	/* some of its paths share a risk group: risk says which */
};

/* Stored in struct rule (the pinned rules map): append-only (see enum
 * stat_id). */
enum spread_mode {
	SPREAD_ROUND_ROBIN = 0, /* initial subflows take the paths in turn */
	SPREAD_WEIGHTED = 1,	/* initial subflows in proportion to weights */
	SPREAD_PREFERRED = 2,	/* the first usable path of the list */
};

/* A rule: its selector (family, remote CIDRs, service ports, SYN kinds) and
 * its spread actor's data (an ordered path list, weights, the mode). */
struct rule {
	__u32 npaths;
	__u32 flags;   /* enum rule_flag */
	__u32 rr;      /* cursor for initial subflows; atomic */
	__u32 nbackup; /* the last nbackup of paths are backup paths (backup actor) */
	__u8 paths[MAX_PATHS + 1];
	/* Selector. */
	__u8 family; /* AF_INET, AF_INET6, or 0 for both */
	__u8 match;  /* enum rule_match; 0 means MATCH_INITIAL | MATCH_JOIN */
	__u8 spread; /* enum spread_mode */
	__u8 nports;
	__u32 max_subflows; /* block: a connection's subflows, the first included; 0: no limit */
	struct port_range ports[MAX_RULE_PORTS];
	__u8 weights[MAX_PATHS + 1]; /* SPREAD_WEIGHTED: per slot of paths, 1..255 */
	__u32 blocked;		     /* block: bit p set, a peer's join arriving on path p is refused */
	/* The first npreferred paths are a tenant's preferred ones: in every
	 * spread mode the initial subflow takes the first of them that is up,
	 * and the mode decides only when none is. */
	__u32 npreferred;
	/* Per slot of paths, the paths (bit p: path p) of the slot's shared-risk
	 * group, itself included; 0 for a path in no group. A join goes to a
	 * path whose group its connection does not use yet first (claim_path). */
	__u32 risk[MAX_PATHS + 1];
};

/* Key of rule_cidrs, an LPM trie: the rule id and the family (always matched
 * in full), then the remote address (IPv4 in the first 4 bytes), so
 * prefixlen is 40 + the CIDR's prefix length. */
#define CIDR_KEY_FIXED_BITS 40
struct cidr_key {
	__u32 prefixlen;
	__u32 rule;  /* big endian: the trie compares bytes in order */
	__u8 family; /* AF_INET or AF_INET6: an IPv6 ::/0 never selects IPv4 */
	__u8 addr[16];
	__u8 pad[3];
};

/* path_state: per path index, set by the agent. */
enum path_flag {
	PATH_DOWN = 1U << 0, /* link down: never place a subflow here */
};

struct path_state {
	__u32 flags;
	__u32 pad;
};

/* Key of peers_down, an LPM trie of the peers' pod CIDRs: the family
 * (always matched in full) then the address (IPv4 in the first 4 bytes),
 * so prefixlen is 32 + the CIDR's prefix length. */
#define PEER_KEY_FIXED_BITS 32
struct peer_cidr_key {
	__u32 prefixlen;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

/* Value of peers_down: the paths (bit i: path i) the liveness probes find
 * down towards the peer node that holds the CIDR, while other peers keep
 * them up. */
struct peer_paths {
	__u32 down;
	__u32 pad;
};

/* Record actor: traffic of a selected pod at its veth, keyed by the pod's
 * endpoint_key. */
struct pod_stats {
	__u64 tx_packets; /* sent by the pod */
	__u64 tx_bytes;
	__u64 rx_packets; /* received by the pod */
	__u64 rx_bytes;
};

/* Record actor: one selected pod's counters, at the slot the agent gave it
 * (struct endpoint's pod_slot). owner is the address the slot was given to,
 * so that a subflow still carrying the slot of a pod released since (its
 * connection still open) counts nothing if the slot went to another pod. */
struct pod_record {
	struct endpoint_key owner;
	__u32 pad;
	struct pod_stats stats;
};

/* Slots of pod_records: one per endpoint, 0 meaning none. */
#define MAX_PODS LIMIT_PODS

/* A NIC of this node, keyed by ifindex in nic_paths. */
struct nic {
	__u32 path;
	__u32 flags; /* enum nic_flag */
};

/* A path's NIC on this node and the next hop beyond it, indexed by the
 * path in path_nics: where a subflow's packet that left by another NIC goes
 * (nic_egress). ifindex 0: no NIC known; nh_family 0: the NIC's link, the
 * packet's own destination the next hop. */
struct path_nic {
	__u32 ifindex;
	__u32 nh_family; /* AF_INET, AF_INET6 or 0 */
	__u8 nh[16];	 /* IPv4 in the first 4 bytes */
};

/* An overlay's outer packet, UDP to the tunnel's port, by its destination
 * (a peer node's address the tunnel sends to) and the path of the subflow
 * it carries: tunnel_hops holds where it goes instead. Path 0 keys a peer's
 * address as the source of an arrival: one from it to the node's address on
 * the same path takes its NIC's path. */
struct tunnel_hop_key {
	__u8 family; /* AF_INET or AF_INET6 */
	__u8 path;
	__u8 pad[2];
	__u8 addr[16]; /* IPv4 in the first 4 bytes */
};

/* The outer packet's new addresses: the node's own on the path and the
 * peer's there; slot is the peer's in peer_slots, whose pod CIDRs the
 * inner destination must be in. For path 0, local is the node's address an
 * arrival from the peer's must be to. */
struct tunnel_hop {
	__u8 local[16];
	__u8 remote[16];
	__u32 slot;
};

/* The overlay's tunnel device, on no path itself (path 0): what it
 * decapsulates came by the path its outer packet's mark names, or by none. */
enum nic_flag {
	NIC_TUNNEL = 1U << 0,
};

/* Record actor: per MPTCP option subtype (RFC 8684 section 3), indexed by
 * the subtype. */
struct mptcp_subtype_stats {
	__u64 packets; /* packets carrying a valid option of this subtype */
	__u64 invalid; /* packets carrying one whose length RFC 8684 does not define */
};

struct path_stats {
	__u64 tx_packets; /* marked for this path at the pod's veth */
	__u64 tx_bytes;
	__u64 rx_packets; /* arrived on this path's NIC for a selected pod */
	__u64 rx_bytes;
};
