/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The rate actor: caps a connection, a pod or a path (docs/datapath.md, "Rate actor").
 *
 *   window  lowers the receive window the pod advertises on its ACKs, so the
 *           peer sends no faster than the cap (pod_egress; caps what the pod
 *           receives). The window is written with the subflow's negotiated
 *           scale and is never raised.
 *   police  drops what exceeds a token bucket (GCRA, lock-free), per
 *           connection, pod and path, on what the pod sends (pod_egress) or
 *           receives (pod_ingress).
 *   shape   classifies what leaves a path's NIC into the agent's HTB class
 *           (nic_egress): the queue, not this program, holds the rate.
 *
 * Configuration is per rule in rate_rules, keyed by the rule id, separate
 * from struct rule so the other actors' layout does not change. */
#pragma once

#include "common.h"
#include "parse.h"
#include "table.h"

/* Stored in struct rate_cfg (the pinned rate_rules): append-only (enum
 * stat_id, common.h). */
enum rate_mode {
	RATE_MODE_NONE = 0,
	RATE_MODE_WINDOW = 1,
	RATE_MODE_POLICE = 2,
	RATE_MODE_SHAPE = 3,
};

/* struct rate_cfg flags. */
enum rate_flag {
	RATE_HEADERS_MAY_BE_REWRITTEN = 1U << 0, /* admin opt-in: window may rewrite */
	RATE_POLICE_EGRESS = 1U << 1,		 /* police what the pod sends */
	RATE_POLICE_INGRESS = 1U << 2,		 /* police what the pod receives */
	/* Every police bucket of the rule is deep enough (coarseClockMinDepth in
	 * internal/datapath/rate.go) that the coarse clock, one scheduler tick behind
	 * at most, is as good as the precise one and cheaper to read. Set by user
	 * space. */
	RATE_COARSE_CLOCK = 1U << 3,
	/* budget names the rule whose pod buckets (police) and HTB classes (shape)
	 * this rule's traffic is charged to: the variants of one policy with the
	 * same caps (a tenant's preferred paths) share one budget, so that a
	 * preference never brings a budget of its own. path_budget names the rule
	 * whose path buckets (police) it is charged to: every variant of the policy
	 * in that mode, whatever its caps, so that the policy's path cap is one. Without
	 * the flag, a rule written before the fields existed, its own. */
	RATE_BUDGET = 1U << 4,
	/* The rule caps each namespace's pods on the node together (perNamespace):
	 * police charges the pod's namespace bucket (pod_namespaces says which and
	 * at what rate: the smallest of the namespace's rules, so one rate per
	 * namespace), after its pod bucket; shape needs no flag of its own beyond
	 * pod_cap_rule's (the namespace's HTB class is the parent of its pods'). */
	RATE_NAMESPACE = 1U << 5,
};

/* A police bucket's GCRA constants, derived by user space from its rate and
 * the rule's burst so that charging a packet needs no division: a byte costs
 * byte_cost / 2^shift ns (rounded up; user space picks the finest shift that
 * keeps byte_cost below 2^32, so that times a 32-bit length it fits 64
 * bits), and the bucket is tau_ns deep. A zero byte_cost means "derive them
 * on the packet": a rule written before these fields existed. */
struct rate_gcra {
	__u64 byte_cost;
	__u64 tau_ns;
	__u32 shift;
	__u32 pad;
};

struct rate_cfg {
	__u32 mode;		       /* enum rate_mode */
	__u32 flags;		       /* enum rate_flag */
	__u64 conn_bps;		       /* bits per second per connection, 0: no cap */
	__u64 pod_bps;		       /* per pod of the rule */
	__u64 burst_bytes;	       /* police: bucket depth; window: largest window granted at once */
	__u64 path_bps[MAX_PATHS + 1]; /* per path index */
	/* police: the buckets' constants, per connection, pod and path */
	struct rate_gcra conn_gcra;
	struct rate_gcra pod_gcra;
	struct rate_gcra path_gcra[MAX_PATHS + 1];
	__u32 budget;	   /* a rule id, with RATE_BUDGET */
	__u32 path_budget; /* a rule id, with RATE_BUDGET */
	__u64 ns_bps; /* per namespace, as written (RATE_NAMESPACE); the bucket's rate is pod_namespaces' */
};

/* rate_budget is the rule id a rule's pod caps and shape classes are kept
 * under. */
static __always_inline __u32 rate_budget(const struct rate_cfg *cfg, __u32 rule)
{
	return cfg->flags & RATE_BUDGET ? cfg->budget : rule;
}

/* rate_path_budget is the rule id a rule's police path caps are kept under. */
static __always_inline __u32 rate_path_budget(const struct rate_cfg *cfg, __u32 rule)
{
	return cfg->flags & RATE_BUDGET ? cfg->path_budget : rule;
}

/* What a bucket, a window edge or a shape class is kept for. Part of struct
 * rate_key, the key of pinned maps (rate_buckets, rate_windows,
 * rate_classes): append-only (enum stat_id, common.h). */
enum rate_key_kind {
	RATE_KEY_CONN = 1, /* id: the connection's canonical (responder's) token */
	RATE_KEY_FLOW = 2, /* id: ports of a subflow whose connection is not known */
	RATE_KEY_POD = 3,  /* addr: the pod */
	RATE_KEY_PATH = 4, /* id: the path index; addr zero */
	RATE_KEY_NS = 5,   /* id: the namespace's id (pod_namespaces); addr zero, rule zero */
};

#define RATE_DIR_EGRESS	 1 /* what the pod sends */
#define RATE_DIR_INGRESS 2 /* what the pod receives */

struct rate_key {
	__u8 addr[16];
	__u32 id;
	__u32 rule; /* the rule's id; for a pod or a path, its budget's (rate_budget, rate_path_budget) */
	__u8 family;
	__u8 kind; /* enum rate_key_kind */
	__u8 dir;  /* RATE_DIR_* */
	__u8 pad;
	__u32 pad2; /* whole 64-bit words: the police table's key */
} __attribute__((aligned(8)));

/* A GCRA bucket: the theoretical arrival time of the next byte. A packet of
 * len bytes is allowed while tat - now stays within the burst; tat moves by
 * the packet's cost. One 64-bit compare-and-swap, no lock. */
struct rate_bucket {
	__u64 tat_ns;
};

/* A connection's paced window edge (window mode), in the low 32 bits of the
 * data sequence space of what the pod receives. */
struct rate_window {
	__u32 edge;
	__u32 valid;
	__u64 last_ns;
};

/* Per subflow, keyed as in subflows: what the rate actor learnt from the
 * handshake. */
#define RATE_SF_POD_SYN	 (1U << 0) /* the pod's SYN or SYN-ACK was seen */
#define RATE_SF_PEER_SYN (1U << 1) /* the peer's SYN or SYN-ACK was seen */
#define RATE_SF_POD_WS	 (1U << 2) /* the pod offered window scaling */
#define RATE_SF_PEER_WS	 (1U << 3) /* the peer offered window scaling */
#define RATE_SF_TOKEN	 (1U << 4) /* conn_token is known */

struct rate_subflow {
	__u32 flags;	  /* RATE_SF_* */
	__u32 pod_shift;  /* the shift the pod announced: its windows are scaled by it */
	__u32 conn_token; /* the connection's canonical token */
	__u32 pad;
};

/* Indexed by rule id, as rules: an array lookup the verifier inlines, on
 * every packet of a selected subflow. Mode RATE_MODE_NONE: no cap. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_RULES);
	__type(key, __u32); /* rule id */
	__type(value, struct rate_cfg);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} rate_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct rate_subflow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} rate_subflows SEC(".maps");

/* Police buckets, a table (table.h) looked up on every policed packet:
 * 2^13 buckets of four, 32768 police buckets. */
#define POLICE_TABLE_BITS 13
#define RATE_KEY_WORDS	  (sizeof(struct rate_key) / 8)
#define RATE_BUCKET_WORDS (sizeof(struct rate_bucket) / 8)

struct police_entry {
	struct rate_key key;
	struct rate_bucket value;
};

struct police_bucket {
	struct table_head head;
	struct police_entry e[TABLE_WAYS];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << POLICE_TABLE_BITS);
	__type(key, __u32);
	__type(value, struct police_bucket);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} rate_buckets SEC(".maps");

_Static_assert(sizeof(struct rate_key) % 8 == 0 && RATE_KEY_WORDS <= TABLE_KEY_WORDS_MAX,
	       "rate_key: whole words");
_Static_assert(sizeof(struct rate_bucket) % 8 == 0, "rate_bucket: whole words");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct rate_key);
	__type(value, struct rate_window);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} rate_windows SEC(".maps");

/* police: the namespace of a selected pod whose rules cap namespaces, and
 * its namespace's bucket: the id keys the bucket (RATE_KEY_NS), shared by
 * every pod of the namespace on the node, and the rate and depth are the
 * namespace's (the smallest perNamespace of its pods' police rules, with
 * that rule's burst). Written by the agent, keyed by each of the pod's
 * addresses (the first words of a struct rate_key, rate_ns_allow). */
struct rate_ns {
	__u32 id;
	__u32 pad;
	__u64 bps;
	__u64 burst_bytes;
	struct rate_gcra gcra;
};

struct pod_ns_key {
	__u8 addr[16];
	__u32 family;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LIMIT_PODS);
	__type(key, struct pod_ns_key);
	__type(value, struct rate_ns);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_namespaces SEC(".maps");

/* shape: the HTB class (TC_H_MAKE(major, minor)) for a pod's traffic on a
 * path (RATE_KEY_POD, id = path) or a rule's traffic on a path
 * (RATE_KEY_PATH); written by the agent, which owns the qdiscs. A rule's
 * path classes are on the path's NIC. A pod's class is on the node's
 * shaping device (an ifb, settings' shape_ifindex), one queue for all its
 * paths, under its namespace's class: nic_egress sends the packet there
 * through the NIC's class SHAPE_MINOR_VIA_IFB, whose filter redirects it,
 * with the pod's minor in skb->tc_index; the ifb gives it back to the NIC,
 * where its rule's path class, if any, takes it, else SHAPE_MINOR_FROM_IFB
 * (the via class's child, under the path's capacity). */
#define SHAPE_MAJOR	     0x6d70
#define SHAPE_MINOR_VIA_IFB  0x2
#define SHAPE_MINOR_FROM_IFB 0x3
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct rate_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} rate_classes SEC(".maps");
