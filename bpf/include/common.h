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

/* Upper bound of paths per node: a 4-bit mark field numbers them 1..15. */
#define MAX_PATHS 15

#define AF_INET	 2
#define AF_INET6 10

/* Drop/skip reasons and events, counted per CPU and read by the agent. Keep in
 * sync with internal/datapath/stats.go (checked by a test against BTF). */
enum stat_id {
	STAT_PACKETS = 0,	 /* packets seen by any program */
	STAT_NOT_TCP,		 /* not TCP (or not IP): passed untouched */
	STAT_MALFORMED,		 /* truncated or malformed headers: passed untouched */
	STAT_MPTCP_SYN,		 /* SYN carrying MP_CAPABLE */
	STAT_JOIN_SYN,		 /* SYN carrying MP_JOIN */
	STAT_JOIN_TOKEN_KNOWN,	 /* MP_JOIN whose token the datapath already knew */
	STAT_JOIN_TOKEN_UNKNOWN, /* MP_JOIN for a connection not (yet) known */
	STAT_TOKEN_LEARNT,	 /* connections learnt from the keys of an MP_CAPABLE ACK */
	STAT_SUBFLOW_PLACED,	 /* new subflows placed on a path (initiator side) */
	STAT_SUBFLOW_MIRRORED,	 /* new subflows recorded at arrival (responder side) */
	STAT_MARKED,		 /* packets given a path mark */
	STAT_NO_PATH,		 /* selected traffic but no usable path configured */
	STAT_PATHS_EXHAUSTED,	 /* a join found every path of its rule in use and shares one */
	STAT_MPTCP_OPT_INVALID,	 /* packets with an MPTCP option of undefined length: option ignored */
	STAT_OBSERVED,		 /* observe-only: packets that would have been given a path mark */
	STAT_RATE_DROP_CONN,	 /* police: dropped, the connection's bucket was empty */
	STAT_RATE_DROP_POD,	 /* police: dropped, the pod's bucket was empty */
	STAT_RATE_DROP_PATH,	 /* police: dropped, the path's bucket was empty */
	STAT_RATE_WND_LOWERED,	 /* window: an ACK's receive window lowered to the cap */
	STAT_RATE_NO_WSCALE,	 /* window: handshake not seen, scale unknown, ACK left alone */
	STAT_RATE_SHAPED,	 /* shape: packets given an HTB class at a NIC */
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
#define SETTING_OBSERVE_ONLY (1U << 0) /* record everything, write no mark */

struct settings_value {
	__u32 flags; /* SETTING_* */
	__u32 reserved[15];
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
};

enum subflow_role {
	ROLE_INITIATOR = 1, /* the local pod opened it; this node chose the path */
	ROLE_RESPONDER = 2, /* a remote peer opened it; this node mirrors its arrival NIC */
};

struct subflow {
	__u32 path;  /* path index, 0-based */
	__u32 role;  /* enum subflow_role */
	__u32 token; /* MP_JOIN token (receiver's), 0 for the initial subflow */
	__u32 rule;  /* the rule that selected it: actors read their data there */
	__u64 created_ns;
};

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
};

struct conn_alias {
	__u32 canonical; /* the responder's token: the conn_states key */
	__u32 pad;
};

struct conn {
	__u32 used;  /* bit p set: a subflow of the connection is on path p; atomic */
	__u32 joins; /* joins this node placed; atomic */
};

/* A local pod address that a rule selects. */
struct endpoint_key {
	__u8 addr[16];
	__u8 family;
	__u8 pad[3];
};

struct endpoint {
	__u32 rule;
	__u32 flags;
};

/* The spread actor's data: an ordered list of path indexes. */
struct rule {
	__u32 npaths;
	__u32 flags;
	__u32 rr; /* round-robin cursor for initial subflows; atomic */
	__u32 pad;
	__u8 paths[MAX_PATHS + 1];
};

/* A NIC of this node, keyed by ifindex in nic_paths. */
struct nic {
	__u32 path;
	__u32 flags;
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
