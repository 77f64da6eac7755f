// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// go:build ignore

/* The mptcp-operator datapath: TC programs that place each MPTCP subflow of a
 * selected pod on one of the node's paths (NICs) and mirror the placement of
 * subflows that remote peers open.
 *
 *   pod_egress  (TC ingress of a pod's host-side veth: what the pod sends)
 *       known subflow            -> mark with its path
 *       new MP_CAPABLE SYN       -> spread: the rule's next path, round robin
 *       MP_CAPABLE ACK (keys)    -> learn the connection's two tokens
 *       new MP_JOIN SYN          -> spread: a path no subflow of the
 *                                   connection uses yet
 *   pod_ingress (TC egress of a pod's host-side veth: what the pod receives)
 *       known subflow            -> rate: police what the pod receives
 *       a peer's join that came by no path's NIC -> refused when its rule
 *                                   limits joins (nic_ingress never saw it)
 *   nic_egress  (TC egress of a path's NIC)
 *       a selected pod's packet  -> shape: the HTB class of its pod or path
 *   nic_ingress (TC ingress of a path's NIC)
 *       anything for a selected pod -> mark with the NIC's path (reverse-path
 *                                   filtering with src_valid_mark then sees
 *                                   the path's table)
 *       a known subflow of a pod no longer selected -> the same mark, nothing
 *                                   else (its peer may still send it here)
 *       SYN opening a subflow    -> wait (arrivals) for the pod's answer,
 *                                   which leaves by the same NIC
 *       third ACK of that answer -> record the arrival path, so the pod's
 *                                   replies keep leaving by that NIC, and
 *                                   count the path as used by the
 *                                   connection
 *       MP_CAPABLE ACK (keys)    -> learn the connection's two tokens
 *
 * The rate actor (rate_actor.h) runs on known subflows at both pod hooks:
 * window lowers the receive window of the pod's ACKs, police drops.
 *
 * Otherwise the mark is the only thing written: packets are not modified, and
 * everything that is not selected TCP passes untouched. In observe-only mode
 * (SETTING_OBSERVE_ONLY in the settings map, switched at run time) not even
 * the mark is: the programs record subflows, connections and counters as
 * they would otherwise, and count STAT_OBSERVED where they would mark. */

#include <linux/udp.h>

#include "common.h"
#include "parse.h"
#include "sha256.h"
#include "table.h"
#include "rate.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* EEXIST from the kernel's errno.h, which BPF programs cannot include. */
#define EEXIST_ERRNO 17

/* Which bits of skb->mark are ours, set by the agent before load. Other bits
 * belong to kube-proxy, the CNI and others and are preserved. */
volatile const __u32 mark_mask = 0x00f00000;
volatile const __u32 mark_shift = 20;

/* Keeps enum limit in BTF, so a test checks Go's limits against it. */
const enum limit *unused_limit __attribute__((unused));
/* Keeps enum stat_id in BTF so bpf2go emits it for the agent. */
const enum stat_id *unused_stat_id __attribute__((unused));
/* Keeps enum mptcp_subtype in BTF, so a test checks Go's subtypes against it. */
const enum mptcp_subtype *unused_mptcp_subtype __attribute__((unused));
/* Keeps enum spread_mode in BTF, checked against Go's SpreadMode. */
const enum spread_mode *unused_spread_mode __attribute__((unused));
/* Keeps enum rate_mode in BTF, so Go takes the modes from it. */
const enum rate_mode *unused_rate_mode __attribute__((unused));
/* Keep the other enums stored in pinned maps in BTF, so that Go takes their
 * values from C and a test checks that none moves. */
const enum subflow_role *unused_subflow_role __attribute__((unused));
const enum rate_key_kind *unused_rate_key_kind __attribute__((unused));
/* The flags the agent writes into pinned maps: Go takes them from C too. */
const enum setting_flag *unused_setting_flag __attribute__((unused));
const enum rule_match *unused_rule_match __attribute__((unused));
const enum rule_flag *unused_rule_flag __attribute__((unused));
const enum path_flag *unused_path_flag __attribute__((unused));
const enum nic_flag *unused_nic_flag __attribute__((unused));
const enum rate_flag *unused_rate_flag __attribute__((unused));
/* The tables table_ctl changes (struct table_op's table): between the agent
 * and this object's table_ctl only, never stored. */
enum table_id {
	TABLE_ID_SUBFLOWS = 1,
	TABLE_ID_POLICE = 2,
};

/* Keep the tables' enums in BTF for Go (table.go). */
const enum table_result *unused_table_result __attribute__((unused));
const enum table_op_code *unused_table_op_code __attribute__((unused));
const enum table_id *unused_table_id __attribute__((unused));

/* The subflow table (table.h): every subflow of a local pod the datapath
 * placed or mirrored, by its 4-tuple as the pod sends it. 2^14 buckets of
 * four: 65536 subflows. */
#define SUBFLOW_TABLE_BITS 14
#define FLOW_KEY_WORDS	   (sizeof(struct flow_key) / 8)
#define SUBFLOW_WORDS	   (sizeof(struct subflow) / 8)

struct subflow_entry {
	struct flow_key key;
	struct subflow value;
};

struct subflow_bucket {
	struct table_head head;
	struct subflow_entry e[TABLE_WAYS];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << SUBFLOW_TABLE_BITS);
	__type(key, __u32);
	__type(value, struct subflow_bucket);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} subflows SEC(".maps");

/* The tables' hash seed (table_seed), kept beside the pinned tables so that
 * every load that shares them hashes alike. Programs never read it: user
 * space sets table_seed from it before loading. */
struct table_seed_value {
	__u64 seed[TABLE_SEED_WORDS];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct table_seed_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} table_seeds SEC(".maps");

_Static_assert(sizeof(struct flow_key) % 8 == 0 && FLOW_KEY_WORDS <= TABLE_KEY_WORDS_MAX,
	       "flow_key: whole words");
_Static_assert(sizeof(struct subflow) % 8 == 0 && SUBFLOW_WORDS <= TABLE_VALUE_WORDS_MAX,
	       "subflow: whole words");

static __always_inline struct subflow *subflow_lookup(const struct flow_key *k)
{
	return table_lookup(&subflows, SUBFLOW_TABLE_BITS, (const __u64 *)k, FLOW_KEY_WORDS, SUBFLOW_WORDS);
}

/* Entries per pod: how many entries of the subflow table carry each pod
 * slot (struct subflow's pod_slot), kept as entries are written, rewritten,
 * evicted and deleted, and counted again from the table by the agent when
 * it loads the datapath, and after. A pod holding LIMIT_POD_SUBFLOWS gets no
 * new entry: its new connections take plain routing (its per-pod caps still
 * hold them, rate_actor.h) and the joins its rules select are refused, until
 * some of its subflows close. Without it, one pod's connections, or a flood
 * of handshakes it answers, evicted the entries of every other pod of the
 * node. Slot 0 (no pod) counts nothing. A slot still counting a released
 * pod's open subflows goes to no other address while a clean one is free
 * (internal/datapath/rules.go, freePodSlot). */
#define POD_SUBFLOWS_MAX LIMIT_POD_SUBFLOWS
_Static_assert(POD_SUBFLOWS_MAX * 16 == (1 << SUBFLOW_TABLE_BITS) * TABLE_WAYS,
	       "a pod may hold a sixteenth of the subflow table");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_PODS + 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_subflows SEC(".maps");

/* take_one lowers *v by one unless it is 0: a count must not wrap (a
 * connection's would refuse every join from then on). Bounded attempts: a
 * count left one too high errs on the side of its limit (a rule's maximum,
 * a pod's entries). */
static __always_inline void take_one(__u32 *v)
{
#pragma unroll
	for (int i = 0; i < 8; i++) {
		__u32 old = *(volatile __u32 *)v;

		if (old == 0 || __sync_val_compare_and_swap(v, old, old - 1) == old)
			return;
	}
}

static __always_inline __u32 *pod_subflows_of(__u32 slot)
{
	if (!slot || slot > MAX_PODS)
		return NULL;
	return bpf_map_lookup_elem(&pod_subflows, &slot);
}

/* pod_subflows_full says whether the pod of slot holds all the entries it
 * may. */
static __always_inline bool pod_subflows_full(__u32 slot)
{
	__u32 *n = pod_subflows_of(slot);

	return n && *(volatile __u32 *)n >= POD_SUBFLOWS_MAX;
}

static __always_inline void pod_subflows_add(__u32 slot)
{
	__u32 *n = pod_subflows_of(slot);

	if (n)
		__sync_fetch_and_add(n, 1);
}

/* pod_subflows_take takes entries (at most TABLE_WAYS: what one delete
 * frees) from the count of slot's pod. */
static __always_inline void pod_subflows_take(__u32 slot, int entries)
{
	__u32 *n = pod_subflows_of(slot);

	if (!n)
		return;
#pragma unroll
	for (int i = 0; i < TABLE_WAYS; i++) {
		if (i < entries)
			take_one(n);
	}
}

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 32768);
	__type(key, struct conn_key);
	__type(value, struct conn_alias);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} conn_aliases SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct conn_key);
	__type(value, struct conn);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} conn_states SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct endpoint_key);
	__type(value, struct endpoint);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoints SEC(".maps");

/* A SYN from the wire writes no entry: anyone on a fabric can send SYNs,
 * with a live subflow's 4-tuple (to re-pin the subflow, clear its flags or
 * give back its count), to closed ports, or with a token it learnt (to
 * fill a connection's joins), and a pod can forge its own answer (raw
 * sockets). So a subflow's entry is written only for a handshake the pod
 * answered and the peer completed:
 *   - every SYN waits in arrivals (nic_ingress: stage_syn);
 *   - the pod's SYN-ACK that acknowledges it moves it to answered (a
 *     join's to answered_joins), with the answer's sequence number, and
 *     leaves by the path the SYN came in by (answer_arrival);
 *   - the peer's third ACK that continues the SYN and acknowledges the
 *     answer writes the entry, counts a peer's join, and (an MP_CAPABLE
 *     one) learns the connection (take_third_ack). A sender that does not
 *     see the pod's answer (a blind forger) cannot write it.
 * A handshake the pod answered without MP_CAPABLE fell back to TCP: it
 * gets no entry. A 4-tuple that still has an entry is taken only once the
 * old entry is gone, by an arrival whose third ACK came (acked): at the
 * close the agent hears or sweeps (subflow_closed). LRU maps, not pinned:
 * a flood of SYNs evicts only other SYNs, never an answered arrival (only
 * the pod's own answers write those) nor a live entry, and each pod's SYNs
 * wait in a map of its own (its slot's in arrivals), so a flood at one pod
 * evicts only that pod's waiting SYNs, never another's join. The pod answers a
 * join only for a token it knows and within its subflow limit, so joins
 * have their map apart, which a flood of SYNs at an open port, answered
 * by the pod, cannot push a join out of. An initial subflow whose arrival
 * is lost anyway runs without an entry (plain routing, no counters, the
 * pod's caps); a join's third ACK that finds nothing is stopped, so that
 * the join never completes uncounted. */
struct arrival {
	struct subflow sf;     /* the entry it will be, its join not yet counted */
	__u32 answer_seq;      /* the pod's first answer's sequence number (host order) */
	__u32 answer_seq_last; /* its latest: SYN cookies answer a repeated SYN anew */
	__u32 syn_len;	       /* the data the SYN carried (TCP Fast Open), which the answer acknowledges */
	__u32 state;	       /* ARRIVAL_* */
};

/* struct arrival's state: ARRIVAL_ACKED, in answered, when the peer's third
 * ACK came for an arrival whose 4-tuple still had an entry; and what the
 * rate actor learns from a subflow's SYN and the pod's answer
 * (rate_learn_syn), which pass before the subflow has an entry: its
 * RATE_SF_* flags and the pod's window scale shift. */
#define ARRIVAL_ACKED	      (1U << 0)
#define ARRIVAL_RATE_FLAGS_AT 8
#define ARRIVAL_POD_SHIFT_AT  16

/* One pod's waiting SYNs. */
struct pod_arrivals_map {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LIMIT_POD_ARRIVALS);
	__type(key, struct flow_key);
	__type(value, struct arrival);
};

/* Each selected pod's waiting SYNs, by its pod slot: the agent gives a slot
 * a fresh map when it gives the slot to a pod, and takes it away with the
 * slot. A slot without one stages nothing. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAX_PODS + 1);
	__type(key, __u32);
	__array(values, struct pod_arrivals_map);
} arrivals SEC(".maps");

/* pod_arrivals is the map of waiting SYNs of the pod at slot (NULL: none). */
static __always_inline void *pod_arrivals(__u32 slot)
{
	return bpf_map_lookup_elem(&arrivals, &slot);
}

/* One pod's answered initial subflows, and its answered joins. */
struct pod_answered_map {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LIMIT_POD_ANSWERED);
	__type(key, struct flow_key);
	__type(value, struct arrival);
};

struct pod_joins_map {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LIMIT_POD_ANSWERED_JOINS);
	__type(key, struct flow_key);
	__type(value, struct arrival);
};

/* Each selected pod's answered handshakes, by its pod slot, given and taken
 * with the slot as its waiting SYNs are: a sender that has one pod answer
 * SYNs or joins by the thousand pushes out only that pod's. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAX_PODS + 1);
	__type(key, __u32);
	__array(values, struct pod_answered_map);
} answered SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAX_PODS + 1);
	__type(key, __u32);
	__array(values, struct pod_joins_map);
} answered_joins SEC(".maps");

/* How many joins of one connection (its local pod address and the pod's
 * token) the pod answered since start_ns. The pod's kernel answers every
 * join SYN with a token it knows while the agent is its path manager (the
 * count of subflows is kept at completion), so a peer could otherwise have
 * it answer thousands of joins of its one connection and push other pods'
 * joins out of answered_joins. */
struct join_answers {
	__u64 start_ns;
	__u32 count;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct conn_key);
	__type(value, struct join_answers);
} join_answers SEC(".maps");

/* Room for a copy of an arrival off the stack, where a call chain has none
 * left (take_third_ack: nic_ingress, then learn_connection). Per CPU, and
 * used by nic_ingress alone: TC ingress runs in softirq and never nests on
 * a CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct arrival);
} arrival_scratch SEC(".maps");

/* The selected pod a packet came from, by the host-side interface it
 * entered the node by (skb->ingress_ifindex, kept through forwarding) and
 * its family: the pod's address of that family, its endpoints key. What a
 * pod sends is charged to the pod that sent it whatever source address it
 * wrote (nic_egress). Written by the agent. */
struct pod_if_key {
	__u32 ifindex;
	__u32 family;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct pod_if_key);
	__type(value, struct endpoint_key);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_interfaces SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_RULES);
	__type(key, __u32);
	__type(value, struct rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} rules SEC(".maps");

/* Selector: remote CIDRs per rule (struct cidr_key). */
#define RULE_CIDRS_CAPACITY 16384
_Static_assert(RULE_CIDRS_CAPACITY >= LIMIT_RULES * LIMIT_RULE_CIDRS,
	       "rule_cidrs cannot hold every rule's CIDRs");
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RULE_CIDRS_CAPACITY);
	__type(key, struct cidr_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} rule_cidrs SEC(".maps");

/* Per path index: struct path_state, set by the agent (link down). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_PATHS + 1);
	__type(key, __u32);
	__type(value, struct path_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} path_states SEC(".maps");

/* The pod CIDRs of peers that some path reaches no more while other peers
 * keep it up (struct peer_paths), set by the agent from the liveness
 * probes: a subflow to such a peer detours as from a path down. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LIMIT_PEER_CIDRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct peer_cidr_key);
	__type(value, struct peer_paths);
} peers_down SEC(".maps");

/* Entry 0: how many entries peers_down holds (0: skip the lookup), written
 * by the agent after the entries it counts. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} peers_down_used SEC(".maps");

/* Which peer node a pod address is of, for the liveness probes: each of
 * the peers' pod CIDRs with its peer's slot in peer_traffic
 * (1..LIMIT_PROBED_PEERS), written by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LIMIT_PEER_CIDRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct peer_cidr_key);
	__type(value, __u32);
} peer_slots SEC(".maps");

/* Entry 0: how many entries peer_slots holds (0: skip the lookup). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} peer_slots_used SEC(".maps");

/* Per peer slot: when a selected pod last sent a subflow's packet to one of
 * the peer's pods (pod_egress, bpf_ktime_get_coarse_ns). Only what the
 * node's pods send counts: every connection sends both ways (a receiver
 * its acknowledgements), and what arrives from the wire could be forged to
 * make the node probe every peer at once. The agent reads it through a memory mapping,
 * without a system call: its prober probes the peers with traffic at the
 * probe interval and the others slowly (internal/agent/liveness). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LIMIT_PROBED_PEERS + 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} peer_traffic SEC(".maps");

/* How many packets of a subflow pod_egress sends per note in peer_traffic. */
#define TRAFFIC_SAMPLE 16

/* Record actor: per selected pod, at its endpoint's slot (1..MAX_PODS). An
 * array, so that a packet of a known subflow, which carries the slot, counts
 * its pod without a hash lookup. Replaced pod_counters, a per-CPU hash by
 * address, whose pin an upgrade removes. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_PODS + 1);
	__type(key, __u32);
	__type(value, struct pod_record);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_records SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32); /* ifindex */
	__type(value, struct nic);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nics SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_PATHS + 1);
	__type(key, __u32); /* path index */
	__type(value, struct path_nic);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} path_nics SEC(".maps");

/* Where an overlay's outer packet carrying another path's subflow goes
 * instead (struct tunnel_hop_key). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LIMIT_TUNNEL_HOPS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct tunnel_hop_key);
	__type(value, struct tunnel_hop);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tunnel_hops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STATS_CAPACITY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} stats SEC(".maps");

/* Record actor: packets per MPTCP option subtype, indexed by the subtype
 * (0..15), for every TCP packet a program parses (all of a pod's veth, the
 * packets for local pods and the host on a NIC), selected or not. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MPTCP_SUBTYPES);
	__type(key, __u32);
	__type(value, struct mptcp_subtype_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mptcp_options SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_PATHS + 1);
	__type(key, __u32);
	__type(value, struct path_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} path_counters SEC(".maps");

/* One entry: struct settings_value, rewritten by the agent (observe-only). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct settings_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} settings SEC(".maps");

static __always_inline void count_n(__u32 id, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &id);

	if (v)
		*v += n;
}

static __always_inline void count(__u32 id)
{
	count_n(id, 1);
}

static __always_inline void count_path(__u32 path, __u32 len, bool tx)
{
	struct path_stats *ps = bpf_map_lookup_elem(&path_counters, &path);

	if (!ps)
		return;
	if (tx) {
		ps->tx_packets++;
		ps->tx_bytes += len;
	} else {
		ps->rx_packets++;
		ps->rx_bytes += len;
	}
}

/* count_subtype counts a packet carrying a valid option of subtype. */
static __always_inline void count_subtype(__u32 subtype)
{
	struct mptcp_subtype_stats *st = bpf_map_lookup_elem(&mptcp_options, &subtype);

	if (st)
		st->packets++;
}

/* record_mptcp_options counts, per subtype, the packets that carry a valid
 * option of that subtype and those that carry one with an undefined length.
 * A global function: the verifier checks it once, on its own, instead of
 * once for every state of every calling program that reaches it. */
__noinline int record_mptcp_options(__u32 seen, __u32 invalid)
{
	__u32 bits = seen | invalid;

	if (invalid)
		count(STAT_MPTCP_OPT_INVALID);
	/* Up to the highest subtype present, not all sixteen. (A lone DSS,
	 * most packets, is counted inline by parse_counted and never gets
	 * here.) */
	for (__u32 i = 0; i < MPTCP_SUBTYPES && (bits >> i); i++) {
		struct mptcp_subtype_stats *st;
		__u32 bit = 1U << i;

		/* The key is a copy: a counter whose address a helper takes
		 * lives on the stack, untracked, and kernels before 6.13 then
		 * see the loop's states repeat ("infinite loop detected"). */
		__u32 key = i;

		if (!(bits & bit))
			continue;
		st = bpf_map_lookup_elem(&mptcp_options, &key);
		if (!st)
			continue;
		if (seen & bit)
			st->packets++;
		if (invalid & bit)
			st->invalid++;
	}
	return 0;
}

/* handshake_subtype says whether the packet opens or joins a connection:
 * MP_CAPABLE (3.1), MP_JOIN (3.2) or neither. */
static __always_inline __u32 handshake_subtype(const struct packet *pkt)
{
	if (has_mptcp(pkt, MPTCP_SUB_CAPABLE))
		return MPTCP_SUB_CAPABLE;
	if (has_mptcp(pkt, MPTCP_SUB_JOIN))
		return MPTCP_SUB_JOIN;
	return MPTCP_SUB_NONE;
}

/* mptcp_offset is where the option of subtype starts in the frame. */
static __always_inline __u32 mptcp_offset(const struct packet *pkt, __u32 subtype)
{
	return (__u32)pkt->l4_off + pkt->mptcp.off[subtype];
}

/* observe_only reads the switch. Each program marks a packet at most once,
 * so this is at most one lookup per run, and only for packets it would mark
 * (the verifier inlines the lookup of an array map: a few instructions). */
static __always_inline bool observe_only(void)
{
	__u32 zero = 0;
	struct settings_value *s = bpf_map_lookup_elem(&settings, &zero);

	return s && (s->flags & SETTING_OBSERVE_ONLY);
}

/* observed_instead says whether a packet the datapath would drop must
 * pass, counted, because the node only observes (observe-only mode). */
static __always_inline bool observed_instead(void)
{
	if (!observe_only())
		return false;
	count(STAT_OBSERVED);
	return true;
}

static __always_inline void set_path_mark(struct __sk_buff *skb, __u32 path)
{
	/* The path's index is the mark's value: 0 is "not steered". */
	__u32 value = (path << mark_shift) & mark_mask;

	if (observe_only()) {
		count(STAT_OBSERVED);
		return;
	}
	skb->mark = (skb->mark & ~mark_mask) | value;
	count(STAT_MARKED);
}

/* clear_path_mark takes the path mark off skb. */
static __always_inline void clear_path_mark(struct __sk_buff *skb)
{
	skb->mark &= ~mark_mask;
}

static __always_inline struct endpoint *lookup_endpoint(__u8 family, const __u8 addr[16])
{
	struct endpoint_key k = {.family = family};

	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&endpoints, &k);
}

/* pod_answers is the map of answered handshakes of the selected pod at
 * address addr (NULL: none): its joins' (join) or its initial subflows'. */
static __always_inline void *pod_answers(bool join, __u8 family, const __u8 addr[16])
{
	struct endpoint *ep = lookup_endpoint(family, addr);
	__u32 slot;

	if (!ep)
		return NULL;
	slot = ep->pod_slot;
	if (join)
		return bpf_map_lookup_elem(&answered_joins, &slot);
	return bpf_map_lookup_elem(&answered, &slot);
}

/* Who may send to the liveness port of a node's address on a path: the
 * peers' probers there, by the node's address and the peer's. An entry
 * whose peer is zero says the node's address is filtered: a datagram to its
 * liveness port from anything but a listed peer's prober (its address, from
 * the same port) is dropped before the agent's socket, so that a flood from
 * elsewhere costs the node no read and no echo lost to a full socket. The
 * agent writes it with the prober's peers. Not pinned: it starts empty at
 * each load, which filters nothing until the agent has written the peers.
 * A first fragment is judged as a whole datagram (the rest never reassemble
 * without it); a later one passes. */
struct liveness_pair {
	__u8 family;
	__u8 pad[3];
	__u8 local[16];
	__u8 peer[16];
};

/* What a peer's prober may send to the node (internal/agent/liveness,
 * wire.go): echoes that carry nonce (the node's prober's nonce for the
 * peer), and probes. A probe that carries nonce as its key is proven; one
 * that does not (a peer of the earlier version, or one that has not learnt
 * the key yet, or a forger with the peer's address) is not. Proven
 * datagrams get four per probe interval (gap_ns, a quarter of it),
 * unproven probes two, each with a burst of LIVENESS_BURST more and
 * counted from its theoretical arrival time (GCRA): a flood forged
 * with a peer's address spends the unproven budget alone, and the peer's
 * proven probes and echoes still reach the socket. The agent writes nonce
 * and gap_ns (from the shortest probe interval a peer may use); the
 * program the times. The address's own entry (peer zero) has neither: its
 * unproven_gap_ns and unproven_at are a budget every peer's unproven
 * probes share besides their own, so that a flood forged with many peers'
 * addresses at once reaches the socket no faster than it can read (0: no
 * shared budget). Before either, a peer's first unproven probe of each of
 * the node's probe intervals (floor_gap_ns, floor_at) passes on its own
 * account: a flood that spends the shared budget starves only the peers
 * whose addresses it forges, not every peer without a key. */
struct liveness_peer {
	__u64 nonce;
	__u64 gap_ns;
	__u64 proven_at;
	__u64 unproven_at;
	__u64 unproven_gap_ns;
	__u64 floor_gap_ns;
	__u64 floor_at;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LIMIT_LIVENESS_PAIRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct liveness_pair);
	__type(value, struct liveness_peer);
} liveness_peers SEC(".maps");

/* A liveness message's first bytes (wire.go): the version 2 key follows
 * them. */
struct liveness_message {
	__u8 magic[4];
	__u8 version;
	__u8 kind;
	__u8 flags;
	__u8 zero;
	__be64 nonce;
	__be64 seq;
	__be64 key;
};

#define LIVENESS_V1_LEN 24
#define LIVENESS_V2_LEN 32
#define LIVENESS_PROBE	1
#define LIVENESS_ECHO	2
#define LIVENESS_BURST	8

/* within_budget spends one datagram of the budget whose theoretical
 * arrival time is *at, one per gap with a burst of LIVENESS_BURST gaps;
 * says whether there was one. Racing CPUs may let a few more by. */
static __always_inline bool within_budget(__u64 *at, __u64 gap)
{
	__u64 now = bpf_ktime_get_ns(), t = *at;

	if (t < now)
		t = now;
	if (t - now > LIVENESS_BURST * gap)
		return false;
	*at = t + gap;
	return true;
}

/* within_floor spends the one datagram a gap allows, with no burst: a
 * peer probing at that interval sends one per gap, whatever its phase. */
static __always_inline bool within_floor(__u64 *at, __u64 gap)
{
	__u64 now = bpf_ktime_get_ns();

	if (now < *at)
		return false;
	*at = now + gap - gap / 4; /* a quarter of slack for jitter */
	return true;
}

/* liveness_admitted says whether the datagram at off (its UDP header) from
 * peer p to the address whose own entry is own may reach the prober's
 * socket. */
static __always_inline bool liveness_admitted(struct __sk_buff *skb, __u32 off, struct liveness_peer *p,
					      struct liveness_peer *own)
{
	struct liveness_message buf = {};
	const struct liveness_message *m;
	const struct udphdr *uh;
	__u16 len;

	uh = header_at(skb, off, sizeof(struct udphdr), &buf);
	if (!uh)
		return false;
	len = bpf_ntohs(uh->len);
	if (len == sizeof(struct udphdr) + LIVENESS_V2_LEN)
		m = header_at(skb, off + sizeof(struct udphdr), LIVENESS_V2_LEN, &buf);
	else if (len == sizeof(struct udphdr) + LIVENESS_V1_LEN)
		m = header_at(skb, off + sizeof(struct udphdr), LIVENESS_V1_LEN, &buf);
	else
		return false; /* no message the prober reads */
	if (!m)
		return false;
	if (m->kind == LIVENESS_ECHO)
		return p->nonce && m->nonce == bpf_cpu_to_be64(p->nonce) &&
		       within_budget(&p->proven_at, p->gap_ns);
	if (len == sizeof(struct udphdr) + LIVENESS_V2_LEN && p->nonce && m->key == bpf_cpu_to_be64(p->nonce))
		return within_budget(&p->proven_at, p->gap_ns);
	if (p->floor_gap_ns && within_floor(&p->floor_at, p->floor_gap_ns))
		return true;
	if (!within_budget(&p->unproven_at, 2 * p->gap_ns))
		return false;
	return !own->unproven_gap_ns || within_budget(&own->unproven_at, own->unproven_gap_ns);
}

/* liveness_datagram takes a packet arriving on a path NIC that is not TCP
 * (pkt, its addresses read). One to the overlay's tunnel port takes the
 * NIC's path mark. A datagram to the liveness port of a filtered
 * node address from no peer's prober there is dropped (in observe-only
 * mode counted and passed). A liveness probe or echo, UDP from and to the
 * agents' port between two nodes' addresses on the path (never to a
 * selected pod), takes the NIC's path mark: with src_valid_mark on the
 * NIC, strict reverse-path filtering then looks its sender up in the
 * path's table, as for the pods' subflows, and accepts it on a NIC that is
 * not the main table's way to that sender. Returns the verdict. A global
 * function: its frame (the key) is not nic_ingress's. */
/* to_tunnel_local says whether pkt is addressed to the node's own tunnel
 * address: only those outer packets are decapsulated here. */
static __always_inline bool to_tunnel_local(const struct settings_value *s, const struct packet *pkt)
{
	__u32 local[4], dst[4];

	if (!s->tunnel_family || s->tunnel_family != pkt->family)
		return false;
	__builtin_memcpy(local, s->tunnel_local, sizeof(local));
	__builtin_memcpy(dst, pkt->daddr, sizeof(dst));
	return local[0] == dst[0] && local[1] == dst[1] && local[2] == dst[2] && local[3] == dst[3];
}

/* same_addr compares two addresses word by word: every address the
 * programs hold (struct packet, map keys and values) is 4-byte aligned. */
static __always_inline bool same_addr(const __u8 a[16], const __u8 b[16])
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;

	return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
}

/* from_tunnel_peer says whether pkt comes from a peer's address on a path
 * to the node's own there (tunnel_hops, path 0): where a tunnel names no
 * address of its own (Cilium's), its peers' steer_tunneled sends each outer
 * packet between the nodes' addresses on the subflow's path. */
static __always_inline bool from_tunnel_peer(const struct packet *pkt)
{
	struct tunnel_hop_key k = {.family = pkt->family};
	struct tunnel_hop *h;

	__builtin_memcpy(k.addr, pkt->saddr, 16);
	h = bpf_map_lookup_elem(&tunnel_hops, &k);
	return h && same_addr(h->local, pkt->daddr);
}

__noinline int liveness_datagram(struct __sk_buff *skb, struct packet *pkt, __u32 path)
{
	__u32 zero = 0, off = 0;
	struct settings_value *s = bpf_map_lookup_elem(&settings, &zero);
	struct liveness_pair k = {};
	struct liveness_peer *peer, *own;
	const __be16 *ports;
	__be16 buf[2], port;
	__u8 proto = 0;
	int ret;

	if (!skb || !pkt || !s || (!s->liveness_port && !s->tunnel_port))
		return TCX_NEXT;
	ret = parse_l3(skb, pkt, &off, &proto);
	if (!pkt->family)
		return TCX_NEXT; /* not IP */
	k.family = pkt->family;
	__builtin_memcpy(k.local, pkt->daddr, 16);
	own = bpf_map_lookup_elem(&liveness_peers, &k);
	/* A whole UDP datagram, or the first fragment of one (the rest
	 * never reassemble without it); to a filtered address, also what
	 * hides its transport behind more extension headers than the parser
	 * reads. */
	if (ret == PARSE_UNREADABLE && own)
		goto refuse;
	if (proto != IPPROTO_UDP || (ret != PARSE_OK && ret != PARSE_NOT_TCP))
		return TCX_NEXT;
	ports = header_at(skb, off, sizeof(buf), buf);
	/* An overlay's outer packet: its inner packet keeps the mark through
	 * decapsulation, and the tunnel device's nic_ingress judges it on
	 * this path. */
	if (ports && s->tunnel_port && ports[1] == bpf_htons(s->tunnel_port)) {
		if (to_tunnel_local(s, pkt) || from_tunnel_peer(pkt))
			set_path_mark(skb, path);
		return TCX_NEXT;
	}
	port = bpf_htons(s->liveness_port);
	if (!s->liveness_port || !ports || ports[1] != port)
		return TCX_NEXT;
	if (own) {
		__builtin_memcpy(k.peer, pkt->saddr, 16);
		if (ports[0] != port)
			goto refuse;
		/* A source of all zeros finds the address's own entry, which
		 * has no budget (gap_ns 0): refused. */
		peer = bpf_map_lookup_elem(&liveness_peers, &k);
		if (!peer || !peer->gap_ns)
			goto refuse;
		/* A first fragment is judged by the whole datagram's length,
		 * and must hold the whole message. */
		if (!liveness_admitted(skb, off, peer, own))
			goto refuse;
	}
	if (ret == PARSE_OK && ports[0] == port && !lookup_endpoint(pkt->family, pkt->daddr))
		set_path_mark(skb, path);
	return TCX_NEXT;
refuse:
	count(STAT_LIVENESS_REFUSED);
	return observed_instead() ? TCX_NEXT : TC_ACT_SHOT;
}

/* note_traffic records in peer_traffic that a selected pod sent a
 * subflow's packet to addr, when addr is in a peer's pod CIDRs. */
static __always_inline void note_traffic(__u8 family, const __u8 addr[16])
{
	struct peer_cidr_key k = {
	    .prefixlen = PEER_KEY_FIXED_BITS + 128,
	    .family = family,
	};
	__u32 zero = 0, *used, *slot;
	__u64 now, *at;

	used = bpf_map_lookup_elem(&peer_slots_used, &zero);
	if (!used || !*used)
		return;
	__builtin_memcpy(k.addr, addr, 16);
	slot = bpf_map_lookup_elem(&peer_slots, &k);
	if (!slot)
		return;
	at = bpf_map_lookup_elem(&peer_traffic, slot);
	now = bpf_ktime_get_coarse_ns();
	/* Written only when the clock moved: the CPUs sending to one peer
	 * share the cache line. */
	if (at && *at != now)
		*at = now;
}

/* count_pod adds a packet to the counters at slot (tx: sent by the pod),
 * if the slot still belongs to the packet's pod address; says whether it
 * did. */
static __always_inline bool count_pod(__u32 slot, __u8 family, const __u8 addr[16], __u32 len, bool tx)
{
	struct pod_record *pr;
	struct pod_stats *ps;

	if (!slot)
		return false;
	pr = bpf_map_lookup_elem(&pod_records, &slot);
	if (!pr || pr->owner.family != family || !same_addr(pr->owner.addr, addr))
		return false;
	ps = &pr->stats;
	if (tx) {
		ps->tx_packets++;
		ps->tx_bytes += len;
	} else {
		ps->rx_packets++;
		ps->rx_bytes += len;
	}
	return true;
}

/* reslot_subflow moves subflow sf, and its place in the entries per pod,
 * to its pod's new slot: once, when packets of it on two CPUs find the old
 * one. A global function: run only when a pod's slot changed, and kept out
 * of the packet path's instructions. */
__noinline int reslot_subflow(struct subflow *sf, __u32 slot)
{
	__u32 old;

	if (!sf)
		return 0;
	old = sf->pod_slot;
	if (old == slot || __sync_val_compare_and_swap(&sf->pod_slot, old, slot) != old)
		return 0;
	pod_subflows_take(old, 1);
	pod_subflows_add(slot);
	return 1;
}

/* count_subflow_pod counts a packet of subflow sf for its local pod (addr)
 * at the slot the entry keeps. An entry without one (made before slots
 * existed), or whose slot is not its pod's any more (the pod was released
 * and selected again since, with another slot), takes the endpoint's. A
 * pod no longer selected counts nothing. */
static __always_inline void count_subflow_pod(struct subflow *sf, __u8 family, const __u8 addr[16], __u32 len,
					      bool tx)
{
	struct endpoint *ep;

	if (count_pod(sf->pod_slot, family, addr, len, tx))
		return;
	ep = lookup_endpoint(family, addr);
	if (!ep || ep->pod_slot == sf->pod_slot)
		return;
	reslot_subflow(sf, ep->pod_slot);
	count_pod(ep->pod_slot, family, addr, len, tx);
}

static __always_inline void count_subflow(struct subflow *sf, __u32 len, bool tx)
{
	if (tx) {
		__sync_fetch_and_add(&sf->tx_packets, 1);
		__sync_fetch_and_add(&sf->tx_bytes, len);
	} else {
		__sync_fetch_and_add(&sf->rx_packets, 1);
		__sync_fetch_and_add(&sf->rx_bytes, len);
	}
}

/* A pure ACK: the ACK flag alone (no SYN, FIN or RST) and no payload. */
static __always_inline bool is_pure_ack(const struct packet *pkt)
{
	return (pkt->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST | TCP_FLAG_ACK)) ==
		   TCP_FLAG_ACK &&
	       pkt->len == (__u32)pkt->l4_off + pkt->tcp_hlen;
}

/* A SYN without ACK opens a subflow; SYN-ACKs and everything later do not. */
static __always_inline bool is_opening_syn(const struct packet *pkt)
{
	return (pkt->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
}

/* An MP_CAPABLE on a segment that is not a SYN is the handshake's third ACK
 * (or the first data, repeating it): the one that carries both keys. */
static __always_inline bool is_capable_ack(const struct packet *pkt)
{
	return has_mptcp(pkt, MPTCP_SUB_CAPABLE) && !(pkt->tcp_flags & TCP_FLAG_SYN);
}

/* An MP_JOIN on a segment that is not a SYN is a join's third ACK (the
 * parser accepts it there only with the full HMAC). */
static __always_inline bool is_join_ack(const struct packet *pkt)
{
	return has_mptcp(pkt, MPTCP_SUB_JOIN) && !(pkt->tcp_flags & TCP_FLAG_SYN);
}

static __always_inline int load_join_token(struct __sk_buff *skb, const struct packet *pkt, __u32 *token)
{
	__be32 raw;

	/* MP_JOIN on a SYN: kind, length 12, subtype|B, address id, receiver's
	 * token (RFC 8684 section 3.2, figure 5). */
	if (!has_mptcp(pkt, MPTCP_SUB_JOIN) || !is_opening_syn(pkt))
		return -1;
	if (bpf_skb_load_bytes(skb, mptcp_offset(pkt, MPTCP_SUB_JOIN) + 4, &raw, sizeof(raw)))
		return -1;
	*token = bpf_ntohl(raw);
	return 0;
}

/* lookup_conn_key fills *k with the conn_states key of the connection known
 * by either token; false if the token is unknown. */
static __always_inline bool lookup_conn_key(__u8 family, const __u8 local[16], __u32 token,
					    struct conn_key *k)
{
	struct conn_alias *alias;

	k->family = family;
	k->token = token;
	__builtin_memcpy(k->local, local, 16);
	alias = bpf_map_lookup_elem(&conn_aliases, k);
	if (!alias)
		return false;
	k->token = alias->canonical;
	return true;
}

/* lookup_conn finds a connection by either token; *canonical is its
 * conn_states token. */
static __always_inline struct conn *lookup_conn(__u8 family, const __u8 local[16], __u32 token,
						__u32 *canonical)
{
	struct conn_key k = {.family = family, .token = token};
	struct conn_alias *alias;

	__builtin_memcpy(k.local, local, 16);
	alias = bpf_map_lookup_elem(&conn_aliases, &k);
	if (!alias)
		return NULL;
	k.token = alias->canonical;
	*canonical = alias->canonical;
	return bpf_map_lookup_elem(&conn_states, &k);
}

/* learn_connection records a connection from its MP_CAPABLE ACK, which in v1
 * carries the sender's (initiator's) and the receiver's (responder's) keys
 * (RFC 8684 section 3.1, figure 4). It runs on both nodes: on the initiator's
 * as the ACK leaves the pod, on the responder's as it arrives. Either way it
 * runs before the ACK reaches the other pod and before the local pod can open
 * a join, so every join's token is known when the join arrives. The keys are
 * used here and dropped: only tokens are kept. The local pod is the
 * packet's source (local_is_src) or destination. A global function: once per
 * connection, verified once, and its frame (keys, SHA-256) is not the
 * caller's. */
__noinline int learn_connection(struct __sk_buff *skb, const struct packet *pkt, __u32 local_is_src,
				struct subflow *sf)
{
	struct conn_key k = {};
	struct conn_alias alias = {}, *known;
	long err;
	struct conn c = {};
	__be32 keys[4];
	__u32 initiator_token, responder_token;

	/* Not on a SYN, the parser accepted only the forms with both keys:
	 * ACK, length 20; with data: 22, or 24 with a checksum. */
	if (!skb || !pkt || !sf || !is_capable_ack(pkt))
		return 0;
	k.family = pkt->family;
	__builtin_memcpy(k.local, local_is_src ? pkt->saddr : pkt->daddr, 16);
	/* Once per subflow while its connection is known: a sender that
	 * repeats the ACK with other keys adds nothing to the tables. */
	k.token = sf->conn;
	if (sf->conn && bpf_map_lookup_elem(&conn_states, &k))
		return 0;
	if (bpf_skb_load_bytes(skb, mptcp_offset(pkt, MPTCP_SUB_CAPABLE) + 4, keys, sizeof(keys)))
		return 0;
	responder_token = mptcp_token(bpf_ntohl(keys[2]), bpf_ntohl(keys[3]));
	k.token = responder_token;
	/* The ACK is repeated on data until acknowledged: learn once. */
	known = bpf_map_lookup_elem(&conn_aliases, &k);
	if (known) {
		sf->conn = known->canonical;
		return 0;
	}
	initiator_token = mptcp_token(bpf_ntohl(keys[0]), bpf_ntohl(keys[1]));

	c.used = 1U << (sf->path_index & MAX_PATHS);
	c.rule = sf->rule;
	c.subflows = 1;
	/* An existing entry (its aliases were evicted first) is kept. */
	err = bpf_map_update_elem(&conn_states, &k, &c, BPF_NOEXIST);
	if (!err) {
		__sync_fetch_and_or(&sf->flags, SUBFLOW_COUNTED | SUBFLOW_OWNS_PATH);
		count(STAT_CONN_INSERT);
	} else if (err != -EEXIST_ERRNO)
		count(STAT_MAP_UPDATE_FAILED);
	sf->conn = responder_token;
	alias.canonical = responder_token;
	bpf_map_update_elem(&conn_aliases, &k, &alias, BPF_NOEXIST);
	k.token = initiator_token;
	bpf_map_update_elem(&conn_aliases, &k, &alias, BPF_NOEXIST);
	count(STAT_TOKEN_LEARNT);
	return 0;
}

/* path_up is 1 when path may take subflows, else 0, without a branch (see
 * claim_path). */
static __always_inline __u32 path_up(__u32 path)
{
	struct path_state *ps = bpf_map_lookup_elem(&path_states, &path);

	return ps ? 1 - (ps->flags & PATH_DOWN) : 1;
}

/* path_up_to is path_up for a packet to a peer whose paths down (its
 * peers_down entry, 0 for none) are down: a path that carries nothing to
 * one peer while others answer over it. */
static __always_inline __u32 path_up_to(__u32 path, __u32 down)
{
	return path_up(path) & ~(down >> (path & MAX_PATHS)) & 1;
}

/* paths_down_to is what peers_down holds for the peer node whose pods
 * addr is among, 0 when none: looked up only while peers_down_used says
 * it holds something, so that a node without such a failure pays one
 * array read per packet. */
static __always_inline __u32 paths_down_to(__u8 family, const __u8 *addr)
{
	struct peer_cidr_key k = {
	    .prefixlen = PEER_KEY_FIXED_BITS + 128,
	    .family = family,
	};
	struct peer_paths *pp;
	__u32 zero = 0, *used;

	used = bpf_map_lookup_elem(&peers_down_used, &zero);
	if (!used || !*used)
		return 0;
	__builtin_memcpy(k.addr, addr, 16);
	pp = bpf_map_lookup_elem(&peers_down, &k);
	return pp ? pp->down : 0;
}

static __always_inline bool path_usable(__u32 path)
{
	return path_up(path);
}

/* rule_path is the path in slot of r's list; the mask keeps the verifier
 * sure of the bounds, the asm keeps the compiler from dropping it. */
static __always_inline __u32 rule_path(const struct rule *r, __u32 slot)
{
	asm volatile("" : "+r"(slot));
	return r->paths[slot & MAX_PATHS] & MAX_PATHS;
}

/* rule_nactive is how many of r's paths, from the top, are active: the rest
 * are backup paths, which take a connection's first subflow only when every
 * active path is down and its joins only after the active paths. */
static __always_inline __u32 rule_nactive(const struct rule *r)
{
	__u32 n = r->npaths, b = r->nbackup;

	return b < n ? n - b : n;
}

/* Placement and selection are global functions: the verifier checks each
 * once, on its own, instead of once per state of every caller (their
 * bounded loops would otherwise multiply the callers' states past the
 * verifier's limit). They take scalars and pointers to memory and look their
 * maps up themselves. Return values: a path index, or PLACE_NO_PATH (the
 * rule has no paths) or PLACE_ALL_DOWN (every path of the rule is down). */
#define PLACE_NO_PATH  -1
#define PLACE_ALL_DOWN -2
/* Or'ed into claim_path's path when the join shares a path another subflow
 * of its connection holds (above MAX_PATHS: masked off with it). */
#define PLACE_SHARED 0x100

/* conn_full says whether connection c already has rule r's maximum of
 * subflows: its initial subflow, the peer's joins this node let in (counted
 * once its handshake completed: take_third_ack) and the
 * joins it placed for its pod (counted once placed, whether or not their
 * handshake completes). */
static __always_inline bool conn_full(const struct rule *r, const struct conn *c)
{
	return r && c && r->max_subflows && c->subflows + c->joins >= r->max_subflows;
}

/* below is 1 when a < b, else 0, without a branch (see word_is_zero). */
static __always_inline __u32 below(__u32 a, __u32 b)
{
	__u64 d = (__u64)a - b;

	asm volatile("" : "+r"(d));
	return d >> 63;
}

/* claim_path takes, for a join of the connection ck (its conn_states key),
 * the first usable path of rule_id (from a per-connection cursor; from the
 * top of the list in preferred mode) that no subflow of the connection uses
 * yet; where paths share risk groups, first one of a group the connection
 * does not use yet. Bits are claimed with an atomic OR, so two joins placed at once on
 * two CPUs, or a join placed here while the peer's node mirrors one of its
 * own, never both get the same free path.
 *
 * The loop decides with arithmetic, not branches, whether a slot is in the
 * list, active and up: each branch would teach the verifier a new range of
 * npaths or nact, and the states of later iterations would no longer match
 * (this function alone once took most of the program's verification). */
__noinline int claim_path(__u32 rule_id, const struct conn_key *ck)
{
	struct rule *r = bpf_map_lookup_elem(&rules, &rule_id);
	struct conn *c;
	__u32 npaths, nact, start, first, any = 0, skipped = 0;

	if (!r || !ck)
		return PLACE_NO_PATH;
	npaths = r->npaths;
	if (npaths == 0 || npaths > MAX_PATHS)
		return PLACE_NO_PATH;
	c = bpf_map_lookup_elem(&conn_states, ck);
	if (!c)
		return PLACE_NO_PATH;
	nact = rule_nactive(r);
	if (nact == 0)
		return PLACE_NO_PATH;
	start = __sync_fetch_and_add(&c->joins, 1);
	first = r->spread == SPREAD_PREFERRED ? 0 : start;
	if (r->flags & RULE_SHARED_RISK) {
		/* First an active path that shares no risk group with a
		 * path the connection uses: its subflows should not share a
		 * bottleneck while another active path is free. Backup
		 * paths wait for the pass below, after the active ones. */
		__u32 held = c->used;

		for (__u32 i = 0; i < MAX_PATHS; i++) {
			__u32 active = below(i, nact), listed = below(i, npaths);
			__u32 slot = i + active * ((first + i) % nact - i);
			__u32 path = rule_path(r, slot), up = active & listed & path_up(path);
			__u32 bit = up << path;

			if (bit && !(r->risk[slot & MAX_PATHS] & held) &&
			    !(__sync_fetch_and_or(&c->used, bit) & bit))
				return path;
		}
	}
	for (__u32 i = 0; i < MAX_PATHS; i++) {
		/* The active paths from the cursor, then the backup paths in
		 * order. */
		__u32 active = below(i, nact), listed = below(i, npaths);
		__u32 slot = i + active * ((first + i) % nact - i);
		__u32 path = rule_path(r, slot), up = listed & path_up(path);
		__u32 bit = up << path;

		any |= up;
		skipped += listed & (up ^ 1);
		if (bit && !(__sync_fetch_and_or(&c->used, bit) & bit)) {
			count_n(STAT_PATH_DOWN_SKIPPED, skipped);
			return path;
		}
	}
	count_n(STAT_PATH_DOWN_SKIPPED, skipped);
	if (!any)
		return PLACE_ALL_DOWN;
	/* More subflows than usable paths: share, round robin. */
	count(STAT_PATHS_EXHAUSTED);
	for (__u32 i = 0; i < MAX_PATHS; i++) {
		__u32 path;

		if (i >= npaths)
			break;
		path = rule_path(r, (start + i) % npaths);
		if (path_usable(path))
			return path | PLACE_SHARED;
	}
	return PLACE_ALL_DOWN;
}

/* slot_weight is the weight of slot of rule_id's path list, 0 if the path is
 * down. A global function so its result is opaque to the caller's verifier
 * state: the weighted pass then does not fork per combination of usable
 * paths (2^15 states). */
__noinline __u32 slot_weight(__u32 rule_id, __u32 slot)
{
	struct rule *r = bpf_map_lookup_elem(&rules, &rule_id);

	if (!r || slot > MAX_PATHS)
		return 0;
	if (!path_usable(rule_path(r, slot)))
		return 0;
	return r->weights[slot & MAX_PATHS];
}

/* pick_active chooses among rule_id's active paths by its spread mode,
 * passing over paths that are down. */
__noinline int pick_active(__u32 rule_id)
{
	struct rule *r = bpf_map_lookup_elem(&rules, &rule_id);
	__u32 npaths, start, total = 0;

	if (!r)
		return PLACE_NO_PATH;
	npaths = rule_nactive(r);
	if (npaths == 0 || npaths > MAX_PATHS)
		return PLACE_NO_PATH;
	if (r->spread == SPREAD_PREFERRED) {
		for (__u32 i = 0; i < MAX_PATHS; i++) {
			__u32 path;

			if (i >= npaths)
				break;
			path = rule_path(r, i);
			if (path_usable(path))
				return path;
			count(STAT_PATH_DOWN_SKIPPED);
		}
		return PLACE_ALL_DOWN;
	}
	if (r->spread == SPREAD_WEIGHTED) {
		/* Deterministic: the cursor modulo the usable weights' sum
		 * walks the cumulative weights, so over any sum-long run each
		 * usable path gets exactly its share. */
		for (__u32 i = 0; i < MAX_PATHS; i++) {
			__u32 w;

			if (i >= npaths)
				break;
			w = slot_weight(rule_id, i);
			if (!w)
				count(STAT_PATH_DOWN_SKIPPED);
			total += w;
		}
		if (total == 0)
			return PLACE_ALL_DOWN;
		start = __sync_fetch_and_add(&r->rr, 1) % total;
		for (__u32 i = 0; i < MAX_PATHS; i++) {
			__u32 w;

			if (i >= npaths)
				break;
			w = slot_weight(rule_id, i);
			if (start < w)
				return rule_path(r, i);
			start -= w;
		}
		/* A path went down between the two passes: the first usable. */
		for (__u32 i = 0; i < MAX_PATHS; i++) {
			if (i >= npaths)
				break;
			if (slot_weight(rule_id, i))
				return rule_path(r, i);
		}
		return PLACE_ALL_DOWN;
	}
	start = __sync_fetch_and_add(&r->rr, 1);
	for (__u32 i = 0; i < MAX_PATHS; i++) {
		__u32 path;

		if (i >= npaths)
			break;
		path = rule_path(r, (start + i) % npaths);
		if (path_usable(path))
			return path;
		count(STAT_PATH_DOWN_SKIPPED);
	}
	return PLACE_ALL_DOWN;
}

/* pick_initial chooses the path of a connection's first subflow: the first
 * usable of a tenant's preferred paths, else an active path by the rule's
 * spread mode, or the first usable backup path when no active one is up. */
__noinline int pick_initial(__u32 rule_id)
{
	struct rule *r = bpf_map_lookup_elem(&rules, &rule_id);
	__u32 nact, npref;
	int path;

	if (!r)
		return PLACE_NO_PATH;
	nact = rule_nactive(r);
	npref = r->npreferred;
	for (__u32 i = 0; i < MAX_PATHS; i++) {
		if (i >= npref || i >= nact)
			break;
		path = rule_path(r, i);
		if (path_usable(path))
			return path;
		count(STAT_PATH_DOWN_SKIPPED);
	}
	path = pick_active(rule_id);
	if (path != PLACE_ALL_DOWN || r->nbackup == 0)
		return path;
	for (__u32 i = 0; i < MAX_PATHS; i++) {
		if (i >= r->npaths)
			break;
		if (i < nact)
			continue;
		path = rule_path(r, i);
		if (path_usable(path))
			return path;
	}
	return PLACE_ALL_DOWN;
}

static __always_inline bool port_selected(const struct rule *r, __u16 port)
{
	__u32 n = r->nports;

	if (n == 0)
		return true;
	for (__u32 i = 0; i < MAX_RULE_PORTS; i++) {
		if (i >= n)
			break;
		if (port >= r->ports[i].first && port <= r->ports[i].last)
			return true;
	}
	return false;
}

static __always_inline bool cidr_selected(__u32 rule_id, __u8 family, const __u8 *remote)
{
	struct cidr_key k = {
	    .prefixlen = CIDR_KEY_FIXED_BITS + 128,
	    .rule = bpf_htonl(rule_id),
	    .family = family,
	};

	__builtin_memcpy(k.addr, remote, 16);
	return bpf_map_lookup_elem(&rule_cidrs, &k) != NULL;
}

/* select_rule runs a pod's selector chain on an opening SYN: the first rule
 * (highest priority) whose family, remote CIDRs, service port and SYN kind
 * all match, or RULE_NONE. The service port is the destination port of the
 * opening SYN on both sides (the server's port), so the client's node and
 * the server's node select alike. */
__noinline __u32 select_rule(const struct endpoint *ep, const struct packet *pkt, __u32 local_is_src,
			     __u32 kind)
{
	const __u8 *remote;
	__u32 n;
	__u16 port;

	if (!ep || !pkt)
		return RULE_NONE;
	remote = local_is_src ? pkt->daddr : pkt->saddr;
	port = bpf_ntohs(pkt->dport);
	n = ep->nrules;
	for (__u32 i = 0; i < MAX_POD_RULES; i++) {
		struct rule *r;
		__u32 id, match;

		if (i >= n)
			break;
		id = ep->rules[i];
		r = bpf_map_lookup_elem(&rules, &id);
		if (!r)
			continue;
		if (r->family && r->family != pkt->family)
			continue;
		match = r->match ? r->match : (MATCH_INITIAL | MATCH_JOIN);
		if (!(match & kind))
			continue;
		if (!port_selected(r, port))
			continue;
		if ((r->flags & RULE_CIDRS) && !cidr_selected(id, pkt->family, remote))
			continue;
		return id;
	}
	return RULE_NONE;
}

/* place_subflow chooses the path of a new subflow the pod opens: a join of
 * a known connection follows its connection's rule; anything else goes
 * through the pod's selector chain. Returns 0 when placed, PLACE_REFUSED for
 * a join past its connection's maximum, -1 when nothing is placed. */
#define PLACE_REFUSED 1

static __always_inline int place_subflow(struct __sk_buff *skb, const struct packet *pkt,
					 const struct endpoint *ep, struct subflow *sf)
{
	struct conn_key ck = {};
	__u32 rule_id, kind = MATCH_INITIAL;
	bool join = false;
	int path;

	if (handshake_subtype(pkt) == MPTCP_SUB_JOIN) {
		__u32 token;

		count(STAT_JOIN_SYN);
		if (load_join_token(skb, pkt, &token))
			return -1;
		sf->token = token;
		if (lookup_conn_key(pkt->family, pkt->saddr, token, &ck)) {
			struct conn *c = bpf_map_lookup_elem(&conn_states, &ck);

			if (c) {
				count(STAT_JOIN_TOKEN_KNOWN);
				sf->conn = ck.token;
				rule_id = c->rule;
				if (conn_full(bpf_map_lookup_elem(&rules, &rule_id), c))
					return PLACE_REFUSED;
				join = true;
				goto selected;
			}
		}
		count(STAT_JOIN_TOKEN_UNKNOWN);
		kind = MATCH_JOIN;
	} else {
		count(STAT_MPTCP_SYN);
	}
	rule_id = select_rule(ep, pkt, 1, kind);
	if (rule_id == RULE_NONE) {
		count(STAT_NO_RULE_MATCH);
		return -1;
	}
selected:
	/* A pod holding its share of the table gets no entry: refused before
	 * a join counts against its connection. Its connection runs
	 * unplaced; its join is refused as one past its rule's maximum is
	 * (unplaced, it would escape that maximum). */
	if (pod_subflows_full(sf->pod_slot)) {
		count(STAT_POD_SUBFLOWS_FULL);
		return handshake_subtype(pkt) == MPTCP_SUB_JOIN ? PLACE_REFUSED : -1;
	}
	path = join ? claim_path(rule_id, &ck) : pick_initial(rule_id);
	if (path == PLACE_NO_PATH) {
		count(STAT_NO_PATH);
		return -1;
	}
	if (path < 0) {
		count(STAT_ALL_PATHS_DOWN);
		return -1;
	}
	sf->path_index = path & MAX_PATHS;
	if (join) /* claim_path counted it, and took the path unless shared */
		sf->flags |= path & PLACE_SHARED ? SUBFLOW_COUNTED : SUBFLOW_COUNTED | SUBFLOW_OWNS_PATH;
	sf->role = ROLE_INITIATOR;
	sf->rule = rule_id;
	sf->created_ns = bpf_ktime_get_ns();
	count(STAT_SUBFLOW_PLACED);
	return 0;
}

/* pod_subflows_write keeps the entries per pod for a write of the subflow
 * table (enum table_result): sf was stored, in place of old when one was
 * rewritten or evicted. */
static __always_inline void pod_subflows_write(int result, const struct subflow *sf,
					       const struct subflow *old)
{
	bool moved = result == TABLE_EVICTED || (result == TABLE_REPLACED && old->pod_slot != sf->pod_slot);

	if (moved)
		pod_subflows_take(old->pod_slot, 1);
	if (moved || result == TABLE_INSERTED)
		pod_subflows_add(sf->pod_slot);
}

/* insert_subflow writes a new subflow; an existing entry with the key (a
 * stale one, or the SYN's retransmission) is replaced and not counted, so
 * STAT_SUBFLOW_INSERT counts entries created. A new key of a pod that holds
 * all the entries it may is not written (POD_SUBFLOWS_MAX). A global
 * function: once per subflow, verified once, and its frame is not the
 * packet path's. */
__noinline int insert_subflow(const struct flow_key *fk, const struct subflow *sf)
{
	struct subflow old = {};
	int result;

	if (!fk || !sf)
		return 0;
	if (pod_subflows_full(sf->pod_slot) && !subflow_lookup(fk)) {
		count(STAT_POD_SUBFLOWS_FULL);
		return 0;
	}
	table_insert(&subflows, SUBFLOW_TABLE_BITS, (const __u64 *)fk, FLOW_KEY_WORDS, (const __u64 *)sf,
		     SUBFLOW_WORDS, true, &result, (__u64 *)&old);
	pod_subflows_write(result, sf, &old);
	switch (result) {
	case TABLE_EVICTED:
		count(STAT_SUBFLOW_EVICTED);
		count(STAT_SUBFLOW_INSERT);
		break;
	case TABLE_INSERTED:
		count(STAT_SUBFLOW_INSERT);
		break;
	case TABLE_REPLACED:
		break;
	default:
		count(STAT_MAP_UPDATE_FAILED);
	}
	return 0;
}

/* give_back returns to a subflow's connection what the subflow held, once
 * (SUBFLOW_CLOSED): its path's bit if it held it alone, and one join (placed
 * by this node) or one subflow (the initial one, or a join the peer opened)
 * if it was counted. fk is the subflow's key (its local address finds the
 * connection). */
static __always_inline void give_back(const struct flow_key *fk, struct subflow *sf)
{
	struct conn_key ck = {};
	struct conn *c;
	__u32 flags;

	flags = __sync_fetch_and_or(&sf->flags, SUBFLOW_CLOSED);
	if (!sf->conn || (flags & SUBFLOW_CLOSED))
		return;
	ck.family = fk->family;
	ck.token = sf->conn;
	__builtin_memcpy(ck.local, fk->saddr, 16);
	c = bpf_map_lookup_elem(&conn_states, &ck);
	if (!c)
		return;
	if (flags & SUBFLOW_OWNS_PATH)
		__sync_fetch_and_and(&c->used, ~(1U << (sf->path_index & MAX_PATHS)));
	if ((flags & SUBFLOW_COUNTED) && sf->role == ROLE_INITIATOR && sf->token)
		take_one(&c->joins);
	else if (flags & SUBFLOW_COUNTED)
		take_one(&c->subflows);
	count(STAT_SUBFLOW_CLOSED);
}

/* count_mirrored_join counts a peer's join into its connection c: one
 * subflow, and the path's bit, which the join owns unless another subflow
 * set it first. */
static __always_inline void count_mirrored_join(struct conn *c, struct subflow *sf)
{
	__u32 bit = 1U << (sf->path_index & MAX_PATHS);

	__sync_fetch_and_add(&c->subflows, 1);
	sf->flags |= SUBFLOW_COUNTED;
	if (!(__sync_fetch_and_or(&c->used, bit) & bit))
		sf->flags |= SUBFLOW_OWNS_PATH;
}

/* syn_seq reads a segment's sequence number (host order; 0 if unreadable). */
static __always_inline __u32 syn_seq(struct __sk_buff *skb, const struct packet *pkt)
{
	__be32 seq;

	if (bpf_skb_load_bytes(skb, pkt->l4_off + 4, &seq, sizeof(seq)))
		return 0;
	return bpf_ntohl(seq);
}

/* from_its_pod says whether a packet a pod sends, where it enters the node
 * (TC ingress of the pod's host-side interface), carries the address of
 * that interface's pod, or comes by an interface the agent named no pod of
 * (pod_interfaces): a selected pod that writes a neighbour's address is not
 * the neighbour, and opens no subflow under its rules, counts as it nor
 * answers for it. A pod with no address of the packet's family is no pod
 * of that family's either. */
static __always_inline bool from_its_pod(const struct __sk_buff *skb, const struct packet *pkt)
{
	struct pod_if_key ik = {.ifindex = skb->ifindex, .family = pkt->family};
	struct endpoint_key *owner = bpf_map_lookup_elem(&pod_interfaces, &ik);

	if (owner)
		return same_addr(owner->addr, pkt->saddr);
	ik.family = pkt->family == AF_INET ? AF_INET6 : AF_INET;
	return !bpf_map_lookup_elem(&pod_interfaces, &ik);
}

/* sent_by_selected_pod says whether a packet that entered the node at
 * ifindex came from the selected pod whose address it carries: the
 * interface is one the agent named that pod's (no fallback: a packet that
 * came by any other interface, a bridge's included, is no pod's). */
static __always_inline bool sent_by_selected_pod(__u32 ifindex, const struct packet *pkt)
{
	struct pod_if_key ik = {.ifindex = ifindex, .family = pkt->family};
	struct endpoint_key *owner = bpf_map_lookup_elem(&pod_interfaces, &ik);

	return owner && same_addr(owner->addr, pkt->saddr);
}

/* How long an answered arrival keeps its place against the answer to a
 * later SYN of its 4-tuple: the pod vouched for it, but an answer whose
 * handshake then failed (a blind forger cannot complete one) must not hold
 * the 4-tuple's reuse off for good. Longer than a handshake's first
 * SYN-ACK retransmissions. */
#define ARRIVAL_ANSWERED_HOLD_NS (3ULL * 1000000000ULL)

/* write_arrival makes an arrival (a copy, taken out of its map) the
 * 4-tuple's entry: placed now, and a join counted into its connection c
 * (canonical token) as a mirrored join is. reused: it takes the place of
 * the 4-tuple's previous subflow. */
static __always_inline void write_arrival(const struct flow_key *fk, struct subflow *nsf, struct conn *c,
					  __u32 canonical, bool reused)
{
	nsf->created_ns = bpf_ktime_get_ns();
	if (c && nsf->token) {
		nsf->conn = canonical;
		count_mirrored_join(c, nsf);
	}
	insert_subflow(fk, nsf);
	count(reused ? STAT_ARRIVAL_PROMOTED : STAT_SUBFLOW_MIRRORED);
}

/* Joins of one connection the pod may answer within
 * ARRIVAL_ANSWERED_HOLD_NS: its rule's maxSubflows (or JOIN_ANSWERS_UNCAPPED
 * for a rule without one), and JOIN_ANSWERS_SLACK more for joins that
 * replace closed ones or are refused by the pod's kernel after its answer. */
#define JOIN_ANSWERS_UNCAPPED 8
#define JOIN_ANSWERS_SLACK    8

/* join_answers_spent counts a join answer of the connection of token
 * (fk's local address) and says whether it is one too many for rule_id
 * within the window. */
static __always_inline bool join_answers_spent(const struct flow_key *fk, __u32 token, __u32 rule_id,
					       __u64 now)
{
	struct join_answers fresh = {.start_ns = now, .count = 1}, *w;
	struct conn_key k = {.family = fk->family, .token = token};
	struct rule *r = bpf_map_lookup_elem(&rules, &rule_id);
	__u32 max = (r && r->max_subflows ? r->max_subflows : JOIN_ANSWERS_UNCAPPED) + JOIN_ANSWERS_SLACK;

	__builtin_memcpy(k.local, fk->saddr, 16);
	w = bpf_map_lookup_elem(&join_answers, &k);
	if (!w || (__s64)(now - w->start_ns) >= (__s64)ARRIVAL_ANSWERED_HOLD_NS) {
		bpf_map_update_elem(&join_answers, &k, &fresh, BPF_ANY);
		return false;
	}
	return __sync_fetch_and_add(&w->count, 1) >= max;
}

/* answers_seq says whether ack acknowledges the pod's answer of a (its
 * first or its latest). */
static __always_inline bool answers_seq(const struct arrival *a, __u32 ack)
{
	return ack == a->answer_seq + 1 || ack == a->answer_seq_last + 1;
}

/* How far past its SYN a peer's segment may be and still repeat the
 * MP_CAPABLE ACK: its first data (RFC 8684 3.1: the option is on every
 * segment until the peer acknowledges one). */
#define FIRST_DATA_WINDOW (1U << 16)

/* continues_syn says whether seq, a segment's sequence number from the
 * peer, is its next after the arrival's SYN (and the data that SYN
 * carried): the third ACK's, or its first data's. */
static __always_inline bool continues_syn(const struct arrival *a, __u32 seq)
{
	return seq - (a->sf.syn_seq + 1) <= a->syn_len;
}

/* flow_key_from writes every byte of k (no zeroing needed first). */
static __always_inline void flow_key_from(struct flow_key *k, const struct packet *pkt, bool reverse)
{
	k->family = pkt->family;
	k->pad[0] = 0;
	k->pad[1] = 0;
	k->pad[2] = 0;
	if (reverse) {
		__builtin_memcpy(k->saddr, pkt->daddr, 16);
		__builtin_memcpy(k->daddr, pkt->saddr, 16);
		k->sport = pkt->dport;
		k->dport = pkt->sport;
	} else {
		__builtin_memcpy(k->saddr, pkt->saddr, 16);
		__builtin_memcpy(k->daddr, pkt->daddr, 16);
		k->sport = pkt->sport;
		k->dport = pkt->dport;
	}
}

static __always_inline int parse_counted(struct __sk_buff *skb, struct packet *pkt)
{
	int ret;

	count(STAT_PACKETS);
	ret = parse_packet(skb, pkt);
	if (ret == PARSE_NOT_TCP || ret == PARSE_UNREADABLE_TCP || ret == PARSE_UNREADABLE)
		count(STAT_NOT_TCP);
	else if (ret == PARSE_MALFORMED)
		count(STAT_MALFORMED);
	else if (pkt->mptcp.seen == (1U << MPTCP_SUB_DSS) && !pkt->mptcp.invalid)
		count_subtype(MPTCP_SUB_DSS); /* most packets of a connection: no call */
	else if (pkt->mptcp.seen | pkt->mptcp.invalid)
		record_mptcp_options(pkt->mptcp.seen, pkt->mptcp.invalid);
	if (ret == PARSE_OK && (pkt->mptcp.flags & OPTS_END_BROKEN))
		count(STAT_TCP_OPTS_CUT);
	return ret;
}

/* unreadable_tcp_verdict is the verdict on a packet that is or may be TCP
 * whose header the datapath cannot read (pkt: a fragment of TCP, or IPv6
 * with more extension headers than the parser reads), whose pod side is
 * addr: dropped when addr is a selected pod's (counted; in observe-only
 * mode passed). The pod's kernel reassembles or reads such a segment and
 * obeys its options: a join past its maximum or on a blocked path, an
 * MP_PRIO or an ADD_ADDR would pass every actor. Linux sends TCP with DF
 * set (path MTU discovery), and IPv6 routers never fragment: only a forger,
 * or a namespace with path MTU discovery off, sends a fragmented segment. */
static __always_inline int unreadable_tcp_verdict(const struct packet *pkt, const __u8 addr[16])
{
	if (!lookup_endpoint(pkt->family, addr))
		return TCX_NEXT;
	count(STAT_UNREADABLE_TCP_DROPPED);
	return observed_instead() ? TCX_NEXT : TC_ACT_SHOT;
}

/* drop_ambiguous says whether pkt, to or from a selected pod, is dropped
 * because the pod's kernel could read its MPTCP options otherwise than the
 * datapath (OPTS_AMBIGUOUS, parse.h): a join judged by its first MP_JOIN
 * while the kernel obeys its last, or a B the backup actor sets on one option
 * while the kernel reads another's. Counted; in observe-only mode passed,
 * and read as any other packet. */
static __always_inline bool drop_ambiguous(const struct packet *pkt)
{
	if (!(pkt->mptcp.flags & OPTS_AMBIGUOUS))
		return false;
	count(STAT_MPTCP_OPTS_AMBIGUOUS);
	return !observed_instead();
}

#include "rate_actor.h"
#include "backup.h"
#include "block.h"
#include "detour.h"

/* arrival_syn_state is what the rate actor learns from a SYN of the peer
 * (pod: false) or the pod's answer, in struct arrival's state. */
static __always_inline __u32 arrival_syn_state(const struct packet *pkt, bool pod)
{
	__u32 flags = pod ? RATE_SF_POD_SYN : RATE_SF_PEER_SYN, state = 0;

	if (pkt->wscale) {
		flags |= pod ? RATE_SF_POD_WS : RATE_SF_PEER_WS;
		if (pod)
			state = (__u32)(pkt->wscale - 1) << ARRIVAL_POD_SHIFT_AT;
	}
	return state | flags << ARRIVAL_RATE_FLAGS_AT;
}

/* seed_rate_subflow gives a subflow written from an arrival (key fk, rule
 * rule_id) what the rate actor would have learnt from its SYN and the
 * pod's answer, had it had an entry then: whether each side scales its
 * window, and by what the pod does. Only for rules the actor acts on. */
static __always_inline void seed_rate_subflow(const struct flow_key *fk, __u32 rule_id, __u32 state)
{
	struct rate_cfg *cfg = bpf_map_lookup_elem(&rate_rules, &rule_id);
	struct rate_subflow rs = {};

	if (!cfg || (cfg->mode != RATE_MODE_WINDOW && cfg->mode != RATE_MODE_POLICE))
		return;
	rs.flags = (state >> ARRIVAL_RATE_FLAGS_AT) & 0xff;
	rs.pod_shift = (state >> ARRIVAL_POD_SHIFT_AT) & 0xff;
	bpf_map_update_elem(&rate_subflows, fk, &rs, BPF_ANY);
}

/* What answer_arrival did with a SYN-ACK the pod sends. */
enum arrival_answer {
	ARRIVAL_NONE = 0,	/* it answers no waiting arrival: it goes on */
	ARRIVAL_ANSWERED = 1,	/* the arrival is answered */
	ARRIVAL_REFUSED = 3,	/* a join past its rule's maximum: the answer is dropped */
	ARRIVAL_UNEXPECTED = 4, /* a join's answer on a live 4-tuple for no SYN seen: dropped */
};

/* ack_seq reads a segment's acknowledgment number (host order; 0 if
 * unreadable). */
static __always_inline __u32 ack_seq(struct __sk_buff *skb, const struct packet *pkt)
{
	__be32 ack;

	if (bpf_skb_load_bytes(skb, pkt->l4_off + 8, &ack, sizeof(ack)))
		return 0;
	return bpf_ntohl(ack);
}

/* answer_arrival takes a SYN-ACK the pod sends (skb, key fk) as the pod's
 * answer to the arrival waiting for its 4-tuple, if it acknowledges that
 * SYN (its sequence number, plus the data an MP_CAPABLE SYN carried) and
 * comes from the pod whose address it carries: the arrival moves to
 * answered (a join's to answered_joins) with the answer's sequence number,
 * which the peer's third ACK must acknowledge (take_third_ack), and, while
 * the 4-tuple has no entry, the answer leaves by the path its SYN came in
 * by (the peer's choice, which strict reverse-path filtering there
 * expects); so does the same answer again. An answer without MP_CAPABLE
 * to an MP_CAPABLE SYN is a fallback to TCP: the arrival goes. live is the
 * 4-tuple's entry, if it still has one. An answered arrival keeps its
 * place for ARRIVAL_ANSWERED_HOLD_NS against the answer to another SYN. A
 * join past its rule's maximum, or on a path the rule refuses, is refused
 * here as at its SYN: its answer never leaves, so it never completes (no
 * reset: the peer's SYN may have carried a 4-tuple that was live). A
 * join's answer on a live 4-tuple that acknowledges neither the entry's
 * own SYN nor a waiting one is dropped too: a join the datapath never saw,
 * or whose arrival another SYN took the place of, would otherwise complete
 * uncounted (MP_JOIN SYNs carry no data, so the answer acknowledges the
 * SYN's sequence number + 1 exactly). Returns an enum arrival_answer. A
 * global function: verified once, run only on SYN-ACKs. */
__noinline int answer_arrival(struct __sk_buff *skb, const struct packet *pkt, const struct flow_key *fk,
			      const struct subflow *live)
{
	struct arrival a, *waiting = NULL, *prev;
	__u32 canonical = 0, ack, seq, join;
	void *staged = NULL, *answers;
	struct endpoint *ep;
	struct conn *c = NULL;
	__u64 now;

	if (!skb || !pkt || !fk || !from_its_pod(skb, pkt))
		return ARRIVAL_NONE;
	ack = ack_seq(skb, pkt);
	seq = syn_seq(skb, pkt);
	join = has_mptcp(pkt, MPTCP_SUB_JOIN);
	/* The answer to the live entry's own SYN is that handshake's. */
	if (live && live->role == ROLE_RESPONDER && live->syn_seq && ack == live->syn_seq + 1)
		return ARRIVAL_NONE;
	now = bpf_ktime_get_ns();
	answers = pod_answers(join, fk->family, fk->saddr);
	prev = answers ? bpf_map_lookup_elem(answers, fk) : NULL;
	/* The same answer again (the SYN-ACK retransmitted, or a repeated
	 * SYN answered anew): it leaves as the first did. A word written in
	 * place, so that a third ACK marking the arrival meanwhile is not
	 * undone. */
	if (prev && continues_syn(prev, ack)) {
		prev->answer_seq_last = seq;
		if (!live)
			set_path_mark(skb, prev->sf.path_index);
		return ARRIVAL_ANSWERED;
	}
	ep = lookup_endpoint(fk->family, fk->saddr);
	if (ep)
		staged = pod_arrivals(ep->pod_slot);
	if (staged)
		waiting = bpf_map_lookup_elem(staged, fk);
	if (waiting) /* a copy: an LRU element can be reused by another CPU */
		a = *waiting;
	/* It must answer the waiting SYN, as the same kind of subflow, and
	 * an arrival answered a moment ago keeps its place. */
	if (!waiting || !continues_syn(&a, ack) || !a.sf.token != !join ||
	    (prev && (__s64)(now - prev->sf.created_ns) < (__s64)ARRIVAL_ANSWERED_HOLD_NS)) {
		if (live && join && live->role == ROLE_RESPONDER && live->syn_seq &&
		    ack != live->syn_seq + 1) {
			count(STAT_ANSWER_DROPPED);
			return ARRIVAL_UNEXPECTED;
		}
		return ARRIVAL_NONE;
	}
	if (a.sf.token)
		c = lookup_conn(fk->family, fk->saddr, a.sf.token, &canonical);
	if (a.sf.token && (join_refused(a.sf.rule, c, a.sf.path_index) ||
			   join_answers_spent(fk, a.sf.token, a.sf.rule, now))) {
		bpf_map_delete_elem(staged, fk);
		count(STAT_JOIN_REFUSED);
		return ARRIVAL_REFUSED;
	}
	bpf_map_delete_elem(staged, fk);
	/* By key, from the copy: never through a pointer another CPU may
	 * have handed to another 4-tuple. Answered without MP_CAPABLE: the
	 * pod's listener is plain TCP, and the connection falls back; it is
	 * the pod's plain TCP (capped per pod), and an MP_CAPABLE ACK on it
	 * must teach no connection. */
	a.sf.created_ns = now;
	a.answer_seq = seq;
	a.answer_seq_last = seq;
	a.state |= arrival_syn_state(pkt, true);
	if (answers && (join || has_mptcp(pkt, MPTCP_SUB_CAPABLE)))
		bpf_map_update_elem(answers, fk, &a, BPF_ANY);
	if (!live) {
		set_path_mark(skb, a.sf.path_index);
		count_path(a.sf.path_index, pkt->len, true);
	}
	return ARRIVAL_ANSWERED;
}

/* take_third_ack takes pkt, the peer's third ACK from the wire (an
 * MP_CAPABLE or MP_JOIN ACK, or an MP_CAPABLE one repeated on the first
 * data), as the end of the handshake answered for its 4-tuple fk, if it
 * continues the SYN and acknowledges the pod's answer, and is of the
 * arrival's kind: only a sender that saw the pod's SYN-ACK gets that far.
 * With no entry left on the 4-tuple the arrival becomes its entry, a
 * peer's join counted; otherwise it is marked acked, for subflow_closed to
 * write when the old entry goes. An MP_CAPABLE one learns its connection
 * from the ACK's keys, which only this packet carries (into the arrival:
 * the entry that may still hold the 4-tuple is an older subflow's). The
 * pod's kernel then checks the keys or HMAC itself, which the datapath
 * cannot. Returns 1 when it took the ACK. A global function: run only on
 * third ACKs. */
__noinline int take_third_ack(struct __sk_buff *skb, const struct packet *pkt, const struct flow_key *fk)
{
	__u32 canonical = 0, zero = 0, join = has_mptcp(pkt, MPTCP_SUB_JOIN);
	struct arrival *a, *waiting;
	struct conn *c = NULL;
	void *answers;

	if (!skb || !pkt || !fk)
		return 0;
	answers = pod_answers(join, fk->family, fk->saddr);
	if (!answers)
		return 0;
	waiting = bpf_map_lookup_elem(answers, fk);
	a = bpf_map_lookup_elem(&arrival_scratch, &zero);
	if (!waiting || !a)
		return 0;
	*a = *waiting;
	if (!answers_seq(a, ack_seq(skb, pkt)) || !continues_syn(a, syn_seq(skb, pkt)) ||
	    !a->sf.token != !join)
		return 0;
	if (a->state & ARRIVAL_ACKED)
		return 1; /* the ACK again, or the first data repeating it */
	if (is_capable_ack(pkt))
		learn_connection(skb, pkt, 0, &a->sf);
	if (subflow_lookup(fk)) {
		a->state |= ARRIVAL_ACKED;
		bpf_map_update_elem(answers, fk, a, BPF_EXIST);
		/* The old entry still there: its close writes this one. Gone
		 * meanwhile (its close came between the two looks, and found
		 * nothing acked): written here. */
		if (subflow_lookup(fk))
			return 1;
	}
	/* A pod holding all the entries it may: a join a rule selects never
	 * completes (the caller drops its third ACK, which finds no entry: it
	 * would complete uncounted), anything else runs unplaced. */
	if (pod_subflows_full(a->sf.pod_slot)) {
		count(STAT_POD_SUBFLOWS_FULL);
		if (join && a->sf.rule != RULE_NONE)
			return 0;
		bpf_map_delete_elem(answers, fk);
		return 1;
	}
	/* Taken once: a second CPU with the same ACK finds none. */
	if (bpf_map_delete_elem(answers, fk))
		return 1;
	if (join)
		c = lookup_conn(fk->family, fk->saddr, a->sf.token, &canonical);
	write_arrival(fk, &a->sf, c, canonical, false);
	seed_rate_subflow(fk, a->sf.rule, a->state);
	return 1;
}

/* pod_reset takes a reset the pod sends (key fk) that continues its
 * answer (its sequence number is the answer's + 1: the pod's kernel
 * refusing the handshake it answered) as the end of that handshake: its
 * arrival goes, so that a third ACK coming late never writes it, nor the
 * close of an older subflow of the 4-tuple promotes it. Any other reset
 * (the listener's answer to a stray or forged ACK, which keeps the
 * handshake) changes nothing. A live entry is left to the close the agent
 * hears or sweeps: a pod can forge resets (raw sockets), and one that ended
 * its own subflows' entries while their sockets live would take them out
 * of their caps and their connections' counts. A global function: run only
 * on a selected pod's resets. */
__noinline int pod_reset(struct __sk_buff *skb, const struct packet *pkt, const struct flow_key *fk)
{
	struct arrival *a;
	void *answers;
	__u32 seq;

	if (!skb || !pkt || !fk || !from_its_pod(skb, pkt))
		return 0;
	seq = syn_seq(skb, pkt);
	answers = pod_answers(false, fk->family, fk->saddr);
	a = answers ? bpf_map_lookup_elem(answers, fk) : NULL;
	if (answers && a && answers_seq(a, seq))
		bpf_map_delete_elem(answers, fk);
	answers = pod_answers(true, fk->family, fk->saddr);
	a = answers ? bpf_map_lookup_elem(answers, fk) : NULL;
	if (answers && a && answers_seq(a, seq))
		bpf_map_delete_elem(answers, fk);
	return 0;
}

/* backup_act_arrival runs the backup actor on a peer's join SYN going into
 * the pod (pkt, key fk): the SYN waits in arrivals, so the B the actor sets,
 * and its flags, are the arrival's, which its entry takes when it is
 * written. Returns 1 when the SYN is the arrival's, 0 when no arrival
 * waits with its sequence number (the entry's own SYN, repeated). A global
 * function: run only on join SYNs. */
__noinline int backup_act_arrival(struct __sk_buff *skb, const struct packet *pkt, const struct flow_key *fk)
{
	struct arrival a, *waiting;
	struct endpoint *ep;
	void *staged;
	__u32 flags;

	if (!skb || !pkt || !fk)
		return 0;
	ep = lookup_endpoint(pkt->family, pkt->daddr);
	if (!ep)
		return 0;
	staged = pod_arrivals(ep->pod_slot);
	if (!staged)
		return 0;
	waiting = bpf_map_lookup_elem(staged, fk);
	if (!waiting)
		return 0;
	a = *waiting;
	if (a.sf.syn_seq != syn_seq(skb, pkt))
		return 0;
	flags = a.sf.flags;
	backup_act(skb, pkt, &a.sf);
	if (a.sf.flags != flags)
		bpf_map_update_elem(staged, fk, &a, BPF_EXIST);
	return 1;
}

/* ingress_path is the path of the NIC skb entered the node by, where
 * nic_ingress ran on it (skb->ingress_ifindex is kept through forwarding),
 * or, decapsulated by an overlay's tunnel device, the path of the NIC its
 * outer packet came by (nic_ingress marked it there); 0: none. A packet
 * that came by another interface (a management NIC, another pod's veth) or
 * from the node itself came by no path. */
static __always_inline __u32 ingress_path(const struct __sk_buff *skb)
{
	__u32 ifindex = skb->ingress_ifindex, path;
	struct nic *n = bpf_map_lookup_elem(&nics, &ifindex);

	if (!n)
		return 0;
	if (!(n->flags & NIC_TUNNEL))
		return n->path;
	path = arrival_path(skb);
	return path <= MAX_PATHS ? path : 0;
}

/* on_path_nic says whether skb entered the node by a path (ingress_path). */
static __always_inline bool on_path_nic(const struct __sk_buff *skb)
{
	return ingress_path(skb) != 0;
}

/* What pathless_join decided about a peer's join SYN going into a pod. */
enum pathless_join {
	PATHLESS_PASS = 0,    /* judged at its NIC, or no rule limits its joins */
	PATHLESS_REFUSED = 1, /* the caller answers it with a reset */
	PATHLESS_DROPPED = 2, /* refused on a 4-tuple with an entry: dropped */
};

/* pathless_join judges a peer's join SYN (MP_JOIN, RFC 8684 3.2) going into
 * the selected pod it is addressed to. One that entered the node by a
 * path's NIC was judged there (nic_ingress: staged or refused). One that
 * came by any other interface is on no path: nic_ingress never saw it, so it
 * would be neither counted against its rule's maxSubflows (no arrival, no
 * entry, no count at its third ACK) nor checked against its blocked paths.
 * Counting it at its SYN would let anyone fill a connection's count with
 * SYNs, and it has no path to be mirrored on; so when its rule (its
 * connection's, or the pod's selector chain's for a connection not known)
 * limits joins at all (a maximum or a blocked path), it is refused whatever
 * the connection's count: answered with a reset, or dropped on a 4-tuple
 * that still has an entry (live: the reset would carry a live subflow's
 * 4-tuple). A join no rule limits passes as before. Returns an enum
 * pathless_join. A global function: run only on join SYNs. */
__noinline int pathless_join(struct __sk_buff *skb, const struct packet *pkt, __u32 live)
{
	__u32 token, canonical = 0, rule_id;
	struct endpoint *ep;
	struct conn *c;
	struct rule *r;

	if (!skb || !pkt || on_path_nic(skb))
		return PATHLESS_PASS;
	ep = lookup_endpoint(pkt->family, pkt->daddr);
	if (!ep || load_join_token(skb, pkt, &token))
		return PATHLESS_PASS;
	c = lookup_conn(pkt->family, pkt->daddr, token, &canonical);
	rule_id = c ? c->rule : select_rule(ep, pkt, 0, MATCH_JOIN);
	r = bpf_map_lookup_elem(&rules, &rule_id);
	if (!r || (!r->max_subflows && !r->blocked))
		return PATHLESS_PASS;
	return live ? PATHLESS_DROPPED : PATHLESS_REFUSED;
}

/* pathless_join_ack says whether a join's third ACK going into the pod
 * (key fk, as the pod sends), which came by no path's NIC, continues a
 * handshake that a path's NIC staged and the pod answered (it waits in the
 * pod's answered joins): nic_ingress never sees this ACK, so the join would
 * complete uncounted. The caller drops it; the handshake completes by the
 * path its SYN came by, or not at all. A global function: run only on join
 * ACKs, and its frame is not pod_ingress's. */
__noinline int pathless_join_ack(struct __sk_buff *skb, const struct flow_key *fk)
{
	void *answers;

	if (!skb || !fk || on_path_nic(skb))
		return 0;
	answers = pod_answers(true, fk->family, fk->saddr);
	return answers && bpf_map_lookup_elem(answers, fk);
}

/* What pod_egress_unknown did, besides counting: placed and stored a new
 * subflow, or refused a join (the caller answers it), or nothing. */
enum unknown_flow {
	UNKNOWN_COUNTED = 0,
	UNKNOWN_PLACED = 1,
	UNKNOWN_REFUSED = 2,
};

/* pod_egress_unknown is pod_egress for a packet of no known subflow: it
 * places the subflow an opening SYN of a selected pod starts, and counts the
 * pod's other packets. Returns an enum unknown_flow. A global function:
 * verified once, and its frame (the new subflow) is not the fast path's. */
__noinline int pod_egress_unknown(struct __sk_buff *skb, const struct packet *pkt, const struct flow_key *fk)
{
	struct subflow nsf = {};
	struct endpoint *ep;
	int placed = -1;

	if (!skb || !pkt || !fk)
		return UNKNOWN_COUNTED;
	ep = lookup_endpoint(pkt->family, pkt->saddr);
	if (!ep || !from_its_pod(skb, pkt))
		return UNKNOWN_COUNTED;
	if (is_opening_syn(pkt) && handshake_subtype(pkt) != MPTCP_SUB_NONE) {
		nsf.pod_slot = ep->pod_slot;
		placed = place_subflow(skb, pkt, ep, &nsf);
		if (placed == 0) {
			/* Counted as the subflow's first packet by the caller,
			 * whose rate actor learns the handshake anew: what an
			 * earlier connection of the 4-tuple left goes. */
			insert_subflow(fk, &nsf);
			bpf_map_delete_elem(&rate_subflows, fk);
			return UNKNOWN_PLACED;
		}
	}

	count_pod(ep->pod_slot, pkt->family, pkt->saddr, pkt->len, true);
	return placed == PLACE_REFUSED ? UNKNOWN_REFUSED : UNKNOWN_COUNTED;
}

/* pod_egress sees what a pod sends (TC ingress of its host-side veth). A
 * packet of a known subflow, most of them, takes the path below; anything
 * else goes to pod_egress_unknown first, and the SYN of a subflow it places
 * then goes on as its subflow's first packet. */
SEC("tc")
int pod_egress(struct __sk_buff *skb)
{
	struct packet pkt = {};
	struct flow_key fk;
	struct subflow *sf;
	__u32 path;
	int ret;

	ret = parse_counted(skb, &pkt);
	if (ret == PARSE_UNREADABLE_TCP || ret == PARSE_UNREADABLE)
		return unreadable_tcp_verdict(&pkt, pkt.saddr);
	if (ret != PARSE_OK)
		return TCX_NEXT;
	if (drop_ambiguous(&pkt))
		return TC_ACT_SHOT;

	flow_key_from(&fk, &pkt, false);
	/* A reset ends a handshake answered on its 4-tuple (a rare
	 * packet). */
	if (pkt.tcp_flags & TCP_FLAG_RST)
		pod_reset(skb, &pkt, &fk);
	sf = subflow_lookup(&fk);
	/* The pod's answer to a SYN from the wire (arrivals). Dropped when
	 * refused, except in observe-only mode, which only counts. */
	if ((pkt.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == (TCP_FLAG_SYN | TCP_FLAG_ACK)) {
		ret = answer_arrival(skb, &pkt, &fk, sf);
		if ((ret == ARRIVAL_REFUSED || ret == ARRIVAL_UNEXPECTED) && !observed_instead())
			return TC_ACT_SHOT;
	}
	/* A pod that writes a neighbour's live 4-tuple is not the neighbour:
	 * charged as it, its packet would drain the neighbour's caps; charged
	 * as itself, the neighbour's subflow would carry it past its own. No
	 * pod sends on another's 4-tuple (one address per family), so it is
	 * dropped (counted only, in observe-only mode). */
	if (sf && !from_its_pod(skb, &pkt)) {
		count(STAT_FOREIGN_4TUPLE_DROPPED);
		return observed_instead() ? TCX_NEXT : TC_ACT_SHOT;
	}
	if (!sf) {
		ret = pod_egress_unknown(skb, &pkt, &fk);
		/* A join of the pod's beyond its rule's maximum: the pod's
		 * path manager is set to stay within it, so this is a pod
		 * that opens joins itself. It hears why at once, as a peer
		 * would (block.h), and no subflow is placed. */
		if (ret == UNKNOWN_REFUSED)
			return answer_refused_join(skb, &pkt, 0);
		if (ret != UNKNOWN_PLACED)
			return TCX_NEXT;
		sf = subflow_lookup(&fk);
		if (!sf)
			return TCX_NEXT; /* not stored: counted as a failed update */
	}
	count_subflow_pod(sf, pkt.family, pkt.saddr, pkt.len, true);
	count_subflow(sf, pkt.len, true);
	/* A subflow's first packet and one in TRAFFIC_SAMPLE after: a stream
	 * pays a sixteenth of the lookup, and a subflow that sends sixteen
	 * packets within BusyFor (10 s) keeps its peer busy. */
	if (sf->tx_packets <= 1 || !(sf->tx_packets % TRAFFIC_SAMPLE))
		note_traffic(pkt.family, pkt.daddr);
	if (is_capable_ack(&pkt) && sf->role == ROLE_INITIATOR)
		learn_connection(skb, &pkt, 1, sf);
	/* The path first: a detoured packet is policed as the path it
	 * travels. */
	path = travel_path(sf, paths_down_to(pkt.family, pkt.daddr));
	if (rate_packet(skb, &pkt, &fk, sf, RATE_DIR_EGRESS) == TC_ACT_SHOT)
		return TC_ACT_SHOT;
	set_path_mark(skb, path);
	count_path(path, pkt.len, true);
	return TCX_NEXT;
}

/* pod_ingress_unknown counts a packet for a selected pod that no subflow
 * entry names and caps it, when charged (not a bare TCP ACK), by the path
 * it arrived on: the path of the NIC it came in by (rate_actor.h). */
static __always_inline int pod_ingress_unknown(struct __sk_buff *skb, const struct packet *pkt, bool charged)
{
	struct endpoint *ep = lookup_endpoint(pkt->family, pkt->daddr);
	struct rate_key k = {};
	__u32 path;

	if (!ep)
		return TCX_NEXT;
	count_pod(ep->pod_slot, pkt->family, pkt->daddr, pkt->len, false);
	path = ingress_path(skb);
	if (!charged || !path)
		return TCX_NEXT;
	pod_rate_key(&k, pkt->daddr, pkt->family, RATE_DIR_INGRESS);
	return rate_pod_police(ep, &k, pkt->len, path);
}

/* pod_ingress sees what a selected pod receives, after routing chose the pod
 * (TC egress of its host-side veth). Actors that act on the way into the pod
 * hook in here: they find the subflow (keyed as the pod sends it) and its
 * rule. */
SEC("tc")
int pod_ingress(struct __sk_buff *skb)
{
	struct packet pkt = {};
	struct flow_key fk = {};
	struct subflow *sf;
	int ret;

	ret = parse_counted(skb, &pkt);
	if (ret != PARSE_OK) {
		/* parse_packet reads the addresses of any IP packet, even
		 * one it refuses (not TCP, a fragment, headers that do not
		 * fit): the rate actor caps those by them. */
		if (!pkt.family)
			return TCX_NEXT; /* not IP */
		if ((ret == PARSE_UNREADABLE_TCP || ret == PARSE_UNREADABLE) &&
		    unreadable_tcp_verdict(&pkt, pkt.daddr) == TC_ACT_SHOT)
			return TC_ACT_SHOT;
		return pod_ingress_unknown(skb, &pkt, true);
	}
	if (drop_ambiguous(&pkt))
		return TC_ACT_SHOT;
	flow_key_from(&fk, &pkt, true);
	/* A join's third ACK that came by no path's NIC, for a join whose
	 * SYN did and which the pod answered (a rare packet). */
	if (is_join_ack(&pkt) && pathless_join_ack(skb, &fk)) {
		if (!observed_instead()) {
			count(STAT_JOIN_ACK_DROPPED);
			return TC_ACT_SHOT;
		}
	}
	sf = subflow_lookup(&fk);
	if (is_opening_syn(&pkt) && has_mptcp(&pkt, MPTCP_SUB_JOIN)) {
		/* A peer's join that came by no path's NIC (a rare packet). */
		ret = pathless_join(skb, &pkt, sf != NULL);
		if (ret == PATHLESS_REFUSED)
			return answer_refused_join(skb, &pkt, BPF_F_INGRESS);
		if (ret == PATHLESS_DROPPED && !observed_instead()) {
			count(STAT_JOIN_REFUSED);
			return TC_ACT_SHOT;
		}
		/* A peer's join SYN waits in arrivals (nic_ingress): the
		 * backup actor marks the arrival, not a live entry of its
		 * 4-tuple. */
		if (backup_act_arrival(skb, &pkt, &fk))
			return sf ? TCX_NEXT : pod_ingress_unknown(skb, &pkt, false);
	}
	if (!sf)
		return pod_ingress_unknown(skb, &pkt, rate_has_payload(&pkt));
	count_subflow_pod(sf, pkt.family, pkt.daddr, pkt.len, false);
	count_subflow(sf, pkt.len, false);
	/* A SYN is never a moved subflow's packet, and anyone can send
	 * one with the subflow's 4-tuple (arrivals). */
	if (!(pkt.tcp_flags & TCP_FLAG_SYN))
		follow_peer(sf, arrival_path(skb));
	/* Each actor is called only for the packets it may change (it checks
	 * again): most packets, data, are none of them. */
	if (has_mptcp(&pkt, MPTCP_SUB_JOIN))
		backup_act(skb, &pkt, sf);
	if (has_mptcp(&pkt, MPTCP_SUB_PRIO))
		backup_prio_keep(skb, &pkt, sf);
	if (is_pure_ack(&pkt))
		backup_prio_act(skb, &pkt, sf);
	if (has_mptcp(&pkt, MPTCP_SUB_ADD_ADDR))
		block_add_addr(skb, &pkt, sf);
	return rate_packet(skb, &pkt, &fk, sf, RATE_DIR_INGRESS);
}

/* mark_released_subflow lets a packet of a known subflow of a pod that no
 * rule selects any more (released) through reverse-path filtering. The pod's
 * own node sends such subflows by plain routing at once, but the peer's node
 * may keep sending them over the NIC it placed them on: it releases its pod a
 * little later, or its pod stays selected. Strict rp_filter would drop them
 * (plain routing expects another NIC) and stall the connection; the mark
 * selects the arrival NIC's table for the check. Nothing else is done for a
 * released pod: no counters, no new subflows. */
static __always_inline void mark_released_subflow(struct __sk_buff *skb, const struct packet *pkt,
						  const struct nic *n)
{
	struct flow_key fk = {};

	flow_key_from(&fk, pkt, true);
	if (subflow_lookup(&fk))
		set_path_mark(skb, n->path);
}

/* What stage_syn did with a SYN. */
enum syn_staged {
	SYN_STAGED = 0,	 /* it waits for the pod's answer, or is its entry's own again */
	SYN_REFUSED = 1, /* a join its rule refuses: the caller answers it with a reset */
};

/* stage_syn takes an opening SYN (MP_CAPABLE or MP_JOIN) from the wire (key
 * fk, as the pod sends) to the selected pod of ep, arriving on the path of
 * the NIC it came in by, selected by rule (the caller's choice: a join of a
 * known connection takes its connection's rule, anything else the pod's
 * selector chain; RULE_NONE when none selects it, mirrored all the same):
 * the entry it would be waits for the pod's answer (arrivals), unless
 * it is a join to refuse at once. The peer's node chose this path; the
 * pod's replies follow it, and the pod's own joins avoid it. Returns an
 * enum syn_staged. A global function: its frame (the entry) is not
 * nic_ingress's. */
__noinline int stage_syn(struct __sk_buff *skb, const struct packet *pkt, const struct flow_key *fk,
			 const struct endpoint *ep, __u32 rule)
{
	__u32 token, canonical = 0, path;
	struct arrival a = {};
	struct subflow *prev;
	void *staged;
	struct conn *c;

	if (!skb || !pkt || !fk || !ep)
		return SYN_STAGED;
	path = ingress_path(skb);
	if (!path)
		return SYN_STAGED;
	prev = subflow_lookup(fk);
	a.sf.rule = rule;
	if (handshake_subtype(pkt) == MPTCP_SUB_JOIN && !load_join_token(skb, pkt, &token)) {
		a.sf.token = token;
		c = lookup_conn(pkt->family, pkt->daddr, token, &canonical);
		/* Refused: the peer hears why at once, and no subflow is
		 * mirrored. A SYN on a 4-tuple with an entry is left to the
		 * pod: the reset would carry a live subflow's 4-tuple. So is a
		 * join to a pod holding its share of the subflow table, which
		 * would find no entry at its third ACK. */
		if (!prev && rule != RULE_NONE && pod_subflows_full(ep->pod_slot)) {
			count(STAT_POD_SUBFLOWS_FULL);
			return SYN_REFUSED;
		}
		if (!prev && join_refused(rule, c, path))
			return SYN_REFUSED;
		if (c)
			a.sf.conn = canonical;
	}
	a.sf.path_index = path;
	a.sf.pod_slot = ep->pod_slot;
	a.sf.role = ROLE_RESPONDER;
	a.sf.created_ns = bpf_ktime_get_ns();
	a.sf.syn_seq = syn_seq(skb, pkt);
	/* The same SYN again as the entry's own (its sender repeats it
	 * until the pod's answer arrives, over whichever path): the entry
	 * already says all of it. Any other waits for the pod's answer and
	 * the peer's ACK of it (arrivals). */
	if (prev && prev->role == ROLE_RESPONDER && prev->token == a.sf.token &&
	    prev->syn_seq == a.sf.syn_seq)
		return SYN_STAGED;
	a.syn_len = a.sf.token ? 0 : pkt->len - pkt->l4_off - pkt->tcp_hlen;
	a.state = arrival_syn_state(pkt, false);
	staged = pod_arrivals(ep->pod_slot);
	if (!staged || bpf_map_update_elem(staged, fk, &a, BPF_ANY))
		return SYN_STAGED;
	count(STAT_ARRIVAL_STAGED);
	return SYN_STAGED;
}

SEC("tc")
int nic_ingress(struct __sk_buff *skb)
{
	struct packet pkt = {};
	struct flow_key fk = {};
	__u32 ifindex = skb->ingress_ifindex;
	struct endpoint *ep;
	struct nic tunneled = {};
	struct subflow *sf;
	struct nic *n;

	n = bpf_map_lookup_elem(&nics, &ifindex);
	if (!n)
		return TCX_NEXT;
	if (n->flags & NIC_TUNNEL) {
		/* Decapsulated: judged as if it had arrived by the path NIC
		 * its outer packet came by, whose mark it keeps. The mark is
		 * taken off first: only what is for a selected pod or a
		 * released subflow gets it back below, so that nothing else
		 * decapsulated here is routed by a path's table. */
		tunneled.path = arrival_path(skb);
		if (!tunneled.path)
			return TCX_NEXT;
		clear_path_mark(skb);
		if (tunneled.path > MAX_PATHS)
			return TCX_NEXT;
		n = &tunneled;
	}
	switch (parse_counted(skb, &pkt)) {
	case PARSE_OK:
		break;
	case PARSE_NOT_TCP:
		return tunneled.path ? TCX_NEXT : liveness_datagram(skb, &pkt, n->path);
	case PARSE_UNREADABLE_TCP:
	case PARSE_UNREADABLE:
		if (unreadable_tcp_verdict(&pkt, pkt.daddr) == TC_ACT_SHOT)
			return TC_ACT_SHOT;
		return tunneled.path ? TCX_NEXT : liveness_datagram(skb, &pkt, n->path);
	default:
		return TCX_NEXT;
	}
	ep = lookup_endpoint(pkt.family, pkt.daddr);
	if (!ep) {
		mark_released_subflow(skb, &pkt, n);
		return TCX_NEXT;
	}
	if (drop_ambiguous(&pkt))
		return TC_ACT_SHOT;

	set_path_mark(skb, n->path);
	count_path(n->path, pkt.len, false);

	if (is_opening_syn(&pkt)) {
		__u32 rule = RULE_NONE, token, canonical;
		struct conn *c;

		if (handshake_subtype(&pkt) == MPTCP_SUB_NONE)
			return TCX_NEXT;
		if (handshake_subtype(&pkt) != MPTCP_SUB_JOIN) {
			rule = select_rule(ep, &pkt, 0, MATCH_INITIAL);
		} else if (!load_join_token(skb, &pkt, &token)) {
			c = lookup_conn(pkt.family, pkt.daddr, token, &canonical);
			rule = c ? c->rule : select_rule(ep, &pkt, 0, MATCH_JOIN);
		}
		flow_key_from(&fk, &pkt, true);
		if (stage_syn(skb, &pkt, &fk, ep, rule) == SYN_REFUSED)
			return answer_refused_join(skb, &pkt, 0);
		return TCX_NEXT;
	}
	flow_key_from(&fk, &pkt, true);
	if (!is_capable_ack(&pkt) && !is_join_ack(&pkt))
		return TCX_NEXT;
	/* The third ACK of a handshake the pod answered writes its entry
	 * (take_third_ack). An MP_CAPABLE one repeated on the first data
	 * after that teaches the entry's connection, if it is not known. A
	 * join's third ACK that finds neither is stopped: its arrival was
	 * lost, and the join would complete uncounted. */
	if (take_third_ack(skb, &pkt, &fk))
		return TCX_NEXT;
	sf = subflow_lookup(&fk);
	if (sf && sf->role == ROLE_RESPONDER && is_capable_ack(&pkt) &&
	    syn_seq(skb, &pkt) - (sf->syn_seq + 1) < FIRST_DATA_WINDOW)
		learn_connection(skb, &pkt, 0, sf);
	/* Nor does one on a 4-tuple whose entry is another handshake's: it
	 * would complete a join on a reused 4-tuple uncounted. */
	if (is_join_ack(&pkt) &&
	    (!sf || (sf->role == ROLE_RESPONDER && syn_seq(skb, &pkt) != sf->syn_seq + 1))) {
		count(STAT_JOIN_ACK_DROPPED);
		if (!observed_instead())
			return TC_ACT_SHOT;
	}
	return TCX_NEXT;
}

/* nic_egress_pod caps a packet a selected pod sends out of path's NIC that
 * no subflow entry names (rate_actor.h): police, then shape. The pod is the
 * one whose interface the packet entered the node by, not the one its
 * source address names: a pod that writes a neighbour's address is charged
 * itself, and never drains the neighbour's cap. */
static __always_inline int nic_egress_pod(struct __sk_buff *skb, const struct packet *pkt, __u32 path)
{
	struct pod_if_key ik = {.ifindex = skb->ingress_ifindex, .family = pkt->family};
	struct endpoint_key *sender;
	struct rate_key k = {};
	struct endpoint *ep;

	sender = bpf_map_lookup_elem(&pod_interfaces, &ik);
	if (!sender)
		return TCX_NEXT; /* not from a selected pod */
	ep = bpf_map_lookup_elem(&endpoints, sender);
	if (!ep)
		return TCX_NEXT;
	pod_rate_key(&k, sender->addr, pkt->family, RATE_DIR_EGRESS);
	if (rate_pod_police(ep, &k, pkt->len, path) == TC_ACT_SHOT)
		return TC_ACT_SHOT;
	rate_pod_classify(skb, ep, sender->addr, pkt->family, path);
	return TCX_NEXT;
}

/* steered_path is the path pod_egress last sent sf's packets by: its
 * detour while it has one, else its own (travel_path). */
static __always_inline __u32 steered_path(const struct subflow *sf)
{
	__u32 detour = subflow_detour(sf);

	return detour ? detour : sf->path_index & MAX_PATHS;
}

/* answered_path is the path of the arrival a pod's SYN-ACK answers (key
 * fk, as the pod sends), which has no subflow entry until its third ACK
 * (answer_arrival); 0 for any other packet. */
static __always_inline __u32 answered_path(const struct packet *pkt, const struct flow_key *fk)
{
	struct arrival *a;
	void *answers;

	if ((pkt->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != (TCP_FLAG_SYN | TCP_FLAG_ACK))
		return 0;
	answers = pod_answers(has_mptcp(pkt, MPTCP_SUB_JOIN), fk->family, fk->saddr);
	a = answers ? bpf_map_lookup_elem(answers, fk) : NULL;
	return a ? a->sf.path_index & MAX_PATHS : 0;
}

/* steer_at_edge sends on to path's NIC, and the path's next hop, a
 * subflow's packet that is leaving by another NIC: a CNI that routes its
 * pods' packets itself (eBPF host routing redirects them from the pod's
 * interface to the NIC it picked) skipped the policy routing that the
 * path's mark selects, and rewrote the mark. Whatever the CNI does on the
 * way out of the pod (its policy) it has done. True when redirected; not
 * in observe-only mode, to a path that is down, whose NIC the agent has not
 * named or whose next hop is of another family, for a packet that did not
 * come from the subflow's pod's own interface (forwarded transit included),
 * nor for one the path's NIC cannot carry. A global function: its frame is
 * not nic_egress's. */
__noinline int steer_at_edge(struct __sk_buff *skb, const struct packet *pkt, __u32 path)
{
	struct bpf_redir_neigh nh = {};
	struct path_nic *pn;
	__u32 mtu_len = 0;
	struct nic *n;
	long ret;

	if (!skb || !pkt || observe_only() || !path_usable(path))
		return 0;
	pn = bpf_map_lookup_elem(&path_nics, &path);
	if (!pn || !pn->ifindex || pn->ifindex == skb->ifindex)
		return 0;
	/* Still the path's NIC, not an index the kernel gave a device since. */
	n = bpf_map_lookup_elem(&nics, &pn->ifindex);
	if (!n || n->path != path || (pn->nh_family && pn->nh_family != pkt->family))
		return 0;
	if (!sent_by_selected_pod(skb->ingress_ifindex, pkt))
		return 0;
	/* The pod's MSS follows the NIC the CNI picked: a segment the path's
	 * NIC cannot carry is left to that NIC, not dropped there unseen. */
	if (bpf_check_mtu(skb, pn->ifindex, &mtu_len, 0, BPF_MTU_CHK_SEGS))
		return 0;
	if (pn->nh_family) {
		nh.nh_family = pn->nh_family;
		__builtin_memcpy(nh.ipv6_nh, pn->nh, sizeof(nh.ipv6_nh));
		ret = bpf_redirect_neigh(pn->ifindex, &nh, sizeof(nh), 0);
	} else {
		ret = bpf_redirect_neigh(pn->ifindex, NULL, 0, 0);
	}
	if (ret != TC_ACT_REDIRECT)
		return 0;
	count(STAT_EDGE_STEERED);
	return 1;
}

/* VXLAN's header (RFC 7348): 8 bytes, the I flag set when the VNI is
 * valid, the inner Ethernet frame after it. */
#define VXLAN_HLEN     8
#define VXLAN_FLAG_VNI 0x08

/* read_ip_at reads the IP header at off of a frame whose Ethernet type is
 * eth_proto: IPv4 that is no fragment or IPv6 without extension headers,
 * carrying proto. Its family and addresses go to family, saddr and daddr,
 * where its payload starts to *next; false for anything else. */
static __always_inline bool read_ip_at(struct __sk_buff *skb, __be16 eth_proto, __u32 off, __u8 proto,
				       __u8 *family, __u8 saddr[16], __u8 daddr[16], __u32 *next)
{
	if (eth_proto == bpf_htons(ETH_P_IP)) {
		const struct ipv4_hdr *ip;
		struct ipv4_hdr ip_buf;
		__u32 ihl;

		ip = header_at(skb, off, sizeof(*ip), &ip_buf);
		if (!ip || (ip->ver_ihl >> 4) != 4 || ip->protocol != proto ||
		    (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)))
			return false;
		ihl = (ip->ver_ihl & 0x0f) * 4;
		if (ihl < sizeof(*ip))
			return false;
		*family = AF_INET;
		__builtin_memcpy(saddr, &ip->saddr, 4);
		__builtin_memcpy(daddr, &ip->daddr, 4);
		*next = off + ihl;
		return true;
	}
	if (eth_proto == bpf_htons(ETH_P_IPV6)) {
		const struct ipv6_hdr *ip6;
		struct ipv6_hdr ip6_buf;

		ip6 = header_at(skb, off, sizeof(*ip6), &ip6_buf);
		if (!ip6 || (bpf_ntohl(ip6->ver_tc_flow) >> 28) != 6 || ip6->nexthdr != proto)
			return false;
		*family = AF_INET6;
		__builtin_memcpy(saddr, ip6->saddr, 16);
		__builtin_memcpy(daddr, ip6->daddr, 16);
		*next = off + sizeof(*ip6);
		return true;
	}
	return false;
}

/* read_tunneled_tcp reads into fk (as the pod sends) and flags what an
 * overlay's outer packet carries after its UDP header at off: VXLAN,
 * Ethernet, IP (read_ip_at), then TCP's ports and flags. True when that is
 * TCP. Geneve's packets are not read (its options make the inner offset
 * variable): they leave by the NIC the tunnel picked. */
static __always_inline bool read_tunneled_tcp(struct __sk_buff *skb, __u32 off, struct flow_key *fk,
					      __u8 *flags)
{
	const struct tcp_hdr *tcp;
	struct tcp_hdr tcp_buf;
	const __be16 *proto;
	const __u8 *vxlan;
	__u8 vxlan_buf[VXLAN_HLEN];
	__be16 proto_buf;
	__u32 o = off + sizeof(struct udphdr);

	vxlan = header_at(skb, o, sizeof(vxlan_buf), vxlan_buf);
	if (!vxlan || !(vxlan[0] & VXLAN_FLAG_VNI))
		return false;
	o += VXLAN_HLEN;
	proto = header_at(skb, o + 12, sizeof(proto_buf), &proto_buf);
	if (!proto ||
	    !read_ip_at(skb, *proto, o + ETH_HLEN, IPPROTO_TCP, &fk->family, fk->saddr, fk->daddr, &o))
		return false;
	tcp = header_at(skb, o, sizeof(*tcp), &tcp_buf);
	if (!tcp)
		return false;
	fk->sport = tcp->source;
	fk->dport = tcp->dest;
	*flags = tcp->flags;
	return true;
}

/* answer_path is the path of the arrival a pod's SYN-ACK (fk, flags)
 * answers, read inside a tunnel, whose options are not read: its joins'
 * answers first, then its initial subflows'; 0 for any other packet. */
static __always_inline __u32 answer_path(const struct flow_key *fk, __u8 flags)
{
	struct arrival *a = NULL;
	void *answers;

	if ((flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != (TCP_FLAG_SYN | TCP_FLAG_ACK))
		return 0;
	answers = pod_answers(true, fk->family, fk->saddr);
	if (answers)
		a = bpf_map_lookup_elem(answers, fk);
	if (!a) {
		answers = pod_answers(false, fk->family, fk->saddr);
		if (answers)
			a = bpf_map_lookup_elem(answers, fk);
	}
	return a ? a->sf.path_index & MAX_PATHS : 0;
}

/* An overlay's outer packet as steer_tunneled reads it: Ethernet without a
 * VLAN tag (the tunnel's own device sends it), then IPv4 that is no
 * fragment or IPv6 without extension headers, then UDP. */
struct outer_packet {
	__u8 saddr[16];
	__u32 udp_off;
	__u8 family;
};

/* read_outer reads skb's outer headers into o and k (its family and
 * destination); false for anything else. */
static __always_inline bool read_outer(struct __sk_buff *skb, struct outer_packet *o,
				       struct tunnel_hop_key *k)
{
	const __be16 *proto;
	__be16 proto_buf;

	proto = header_at(skb, 12, sizeof(proto_buf), &proto_buf);
	if (!proto ||
	    !read_ip_at(skb, *proto, ETH_HLEN, IPPROTO_UDP, &o->family, o->saddr, k->addr, &o->udp_off))
		return false;
	k->family = o->family;
	return true;
}

/* to_peer_pods says whether the inner destination (fk's) is in the pod
 * CIDRs of the peer in slot: a node that claimed another's address as its
 * own on a path draws nothing but what goes to its own pods. */
static __always_inline bool to_peer_pods(const struct flow_key *fk, __u32 slot)
{
	struct peer_cidr_key k = {.prefixlen = PEER_KEY_FIXED_BITS + 128, .family = fk->family};
	__u32 *found;

	__builtin_memcpy(k.addr, fk->daddr, 16);
	found = bpf_map_lookup_elem(&peer_slots, &k);
	return slot && found && *found == slot;
}

/* readdress_outer writes the outer packet's addresses (o's source and k's
 * destination) as hop's, and amends the IPv4 header's checksum and the UDP
 * checksum (a zero one, which says there is none, stays zero). Nonzero
 * when a write failed. */
static __always_inline int readdress_outer(struct __sk_buff *skb, const struct outer_packet *o,
					   const struct tunnel_hop_key *k, struct tunnel_hop *hop)
{
	__u32 udp_csum = o->udp_off + offsetof(struct udphdr, check), addrs;
	__s64 diff;

	if (o->family == AF_INET) {
		addrs = ETH_HLEN + offsetof(struct ipv4_hdr, saddr);
		diff = bpf_csum_diff((__be32 *)o->saddr, 4, (__be32 *)hop->local, 4, 0);
		diff = bpf_csum_diff((__be32 *)k->addr, 4, (__be32 *)hop->remote, 4, diff);
		if (diff < 0 ||
		    bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct ipv4_hdr, check), 0, diff, 0) ||
		    bpf_l4_csum_replace(skb, udp_csum, 0, diff, BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0))
			return -1;
		return bpf_skb_store_bytes(skb, addrs, hop->local, 4, 0) ||
		       bpf_skb_store_bytes(skb, addrs + 4, hop->remote, 4, 0);
	}
	addrs = ETH_HLEN + offsetof(struct ipv6_hdr, saddr);
	diff = bpf_csum_diff((__be32 *)o->saddr, 16, (__be32 *)hop->local, 16, 0);
	diff = bpf_csum_diff((__be32 *)k->addr, 16, (__be32 *)hop->remote, 16, diff);
	if (diff < 0 || bpf_l4_csum_replace(skb, udp_csum, 0, diff, BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0))
		return -1;
	return bpf_skb_store_bytes(skb, addrs, hop->local, 16, 0) ||
	       bpf_skb_store_bytes(skb, addrs + 16, hop->remote, 16, 0);
}

/* steer_tunneled sends an overlay's outer packet that carries a subflow of
 * another path than nic_path's on to that path: a tunnel that picks its
 * outer packets' route itself (Cilium's writes the whole mark first) sends
 * every subflow to the peer by one NIC. The outer packet is readdressed from
 * the node's address on the subflow's path to the peer's there
 * (tunnel_hops), marked with the path so that the redirect's route lookup
 * takes the path's table, and redirected to the path's NIC; the peer's
 * nic_ingress marks its arrival with that path (liveness_datagram), and its
 * tunnel device decapsulates it whatever outer addresses it bears. Only a
 * packet the node itself sends (an overlay's encapsulation), to the
 * tunnel's port, carrying a selected pod's subflow (or its answer to an
 * arrival), to an address of a peer the agent named, on a path that is up
 * whose NIC is still the path's and carries it. Returns the verdict: a
 * packet whose rewrite failed half-way is dropped. Not in observe-only
 * mode. A global function: its frame is not nic_egress's. */
__noinline int steer_tunneled(struct __sk_buff *skb, __u32 nic_path)
{
	__u32 zero = 0, path, mtu_len = 0;
	struct settings_value *s = bpf_map_lookup_elem(&settings, &zero);
	struct tunnel_hop_key hk = {};
	struct outer_packet o = {};
	const struct udphdr *udp;
	struct udphdr udp_buf;
	struct flow_key fk = {};
	struct tunnel_hop *hop;
	struct path_nic *pn;
	struct subflow *sf;
	struct nic *n;
	__u8 flags = 0;

	if (!skb || !s || !s->tunnel_port || (s->flags & SETTING_OBSERVE_ONLY))
		return TCX_NEXT;
	if (!read_outer(skb, &o, &hk))
		return TCX_NEXT;
	/* A nonzero UDP checksum of a packet not segmented later may be whole
	 * while the skb's partial checksum is the inner TCP's (local checksum
	 * offload): amended as a pseudo-header seed it would be wrong. Such
	 * packets keep the tunnel's NIC; Cilium's and Linux's VXLAN over IPv4
	 * send none. */
	udp = header_at(skb, o.udp_off, sizeof(*udp), &udp_buf);
	if (!udp || udp->dest != bpf_htons(s->tunnel_port) || (udp->check && !skb->gso_size))
		return TCX_NEXT;
	if (!read_tunneled_tcp(skb, o.udp_off, &fk, &flags) || !lookup_endpoint(fk.family, fk.saddr))
		return TCX_NEXT;
	sf = subflow_lookup(&fk);
	path = sf ? steered_path(sf) : answer_path(&fk, flags);
	if (!path || path == nic_path || !path_usable(path))
		return TCX_NEXT;
	hk.path = path;
	hop = bpf_map_lookup_elem(&tunnel_hops, &hk);
	if (!hop || !to_peer_pods(&fk, hop->slot))
		return TCX_NEXT;
	pn = bpf_map_lookup_elem(&path_nics, &path);
	if (!pn || !pn->ifindex || pn->ifindex == skb->ifindex)
		return TCX_NEXT;
	n = bpf_map_lookup_elem(&nics, &pn->ifindex);
	if (!n || n->path != path)
		return TCX_NEXT;
	if (bpf_check_mtu(skb, pn->ifindex, &mtu_len, 0, BPF_MTU_CHK_SEGS))
		return TCX_NEXT;
	if (readdress_outer(skb, &o, &hk, hop))
		return TC_ACT_SHOT;
	set_path_mark(skb, path);
	if (bpf_redirect_neigh(pn->ifindex, NULL, 0, 0) != TC_ACT_REDIRECT)
		return TC_ACT_SHOT;
	count(STAT_TUNNEL_STEERED);
	return TC_ACT_REDIRECT;
}

/* shape_ifindex is the node's shaping device (settings), 0: none. */
static __always_inline __u32 shape_ifindex(void)
{
	__u32 zero = 0;
	struct settings_value *s = bpf_map_lookup_elem(&settings, &zero);

	return s ? s->shape_ifindex : 0;
}

/* nic_egress runs on the TC egress of each path's NIC: the shape actor
 * classifies a selected pod's packets into the agent's HTB classes there,
 * because forwarding from the pod's veth resets skb->priority; and a pod's
 * packets that no subflow entry names are capped there, by the NIC's path
 * (rate_actor.h). It also runs on the node's shaping device, where it
 * gives each packet the pod class its NIC chose. */
SEC("tc")
int nic_egress(struct __sk_buff *skb)
{
	struct packet pkt = {};
	__u32 ifindex = skb->ifindex, shaper = shape_ifindex(), path;
	struct flow_key fk = {};
	struct subflow *sf;
	bool returned;
	struct nic *n;

	if (shaper && ifindex == shaper) {
		if (skb->tc_index)
			skb->priority = (SHAPE_MAJOR << 16) | skb->tc_index;
		return TCX_NEXT;
	}
	/* The node's own packets (locally sent: no interface received them)
	 * are no pod's, but an overlay's outer packets carry pods' subflows. */
	if (!skb->ingress_ifindex) {
		n = bpf_map_lookup_elem(&nics, &ifindex);
		return n && !(n->flags & NIC_TUNNEL) ? steer_tunneled(skb, n->path) : TCX_NEXT;
	}
	/* Given back by the shaping device: its pod's class and caps are
	 * behind it, its rule's path class is ahead. Without one it goes to
	 * the NIC's class for what the device gives back: the device left
	 * its pod's class in skb->priority, which no class on the NIC has,
	 * and HTB would send it unclassified, ahead of every class and
	 * outside the path's capacity. */
	returned = shaper && skb->ingress_ifindex == shaper;
	if (returned)
		skb->priority = (SHAPE_MAJOR << 16) | SHAPE_MINOR_FROM_IFB;
	n = bpf_map_lookup_elem(&nics, &ifindex);
	if (!n)
		return TCX_NEXT;
	/* Not counted: pod_egress counted these packets already. */
	if (parse_packet(skb, &pkt) == PARSE_OK) {
		/* The subflow, not the pod's endpoint, says which of the
		 * pod's rules selected this traffic: a pod may have several.
		 * pod_egress policed it already. */
		flow_key_from(&fk, &pkt, false);
		sf = subflow_lookup(&fk);
		if (!(n->flags & NIC_TUNNEL)) {
			path = sf ? steered_path(sf) : answered_path(&pkt, &fk);
			if (path && path != n->path && steer_at_edge(skb, &pkt, path))
				return TC_ACT_REDIRECT;
		}
		/* Only the subflow's own pod (or the shaping device, which
		 * it went through first) takes its class: a packet that
		 * merely carries the subflow's 4-tuple, from an unselected
		 * pod or forwarded transit, would fill the pod's queue. It
		 * is charged as what its sender sends outside subflows. */
		if (sf && (returned || sent_by_selected_pod(skb->ingress_ifindex, &pkt))) {
			rate_classify(skb, &pkt, sf->rule, n->path, returned);
			return TCX_NEXT;
		}
		/* Plain TCP: only segments with data are charged, as on a
		 * subflow. */
		if (!rate_has_payload(&pkt))
			return TCX_NEXT;
	} else if (!pkt.family) {
		return TCX_NEXT; /* not IP (the addresses as in pod_ingress) */
	}
	if (returned)
		return TCX_NEXT;
	return nic_egress_pod(skb, &pkt, n->path);
}

/* table_run carries out op on one table (its map, size and word counts). */
static __always_inline int table_run(void *map, __u32 bits, __u32 code, const __u64 *key, __u32 key_words,
				     const __u64 *value, __u32 value_words)
{
	int result = -1;

	if (code == TABLE_OP_DELETE)
		return table_delete(map, bits, key, key_words, value_words);
	if (code == TABLE_OP_INSERT || code == TABLE_OP_INSERT_NEW)
		table_insert(map, bits, key, key_words, value, value_words, code == TABLE_OP_INSERT, &result,
			     NULL);
	return result;
}

/* A close report (TABLE_OP_SUBFLOW_CLOSED's value): when it was heard, and
 * what names the subflow beyond its 4-tuple, so that a report that comes
 * late never closes a newer subflow of the same 4-tuple. 0 matches any. */
struct closed_report {
	__u64 heard_ns;	  /* bpf_ktime_get_ns' clock */
	__u64 created_ns; /* the entry's, as a sweep read it */
	__u32 token;	  /* the connection, either side's token, as the pod's kernel named it */
	__u32 pad;
};

_Static_assert(sizeof(struct closed_report) <= TABLE_VALUE_WORDS_MAX * 8, "closed_report: a table_op value");

/* How late a close report may come after the close: the path manager reads
 * its events as they come. */
#define REPORT_LATE_NS (1000000000ULL)

/* report_names says whether report is about sf, the entry of fk. A global
 * function: the report's type is then in the object's BTF, where user space
 * takes its layout from (bpf2go). */
__noinline int report_names(const struct closed_report *report, const struct flow_key *fk,
			    const struct subflow *sf)
{
	struct conn_alias *alias;
	struct conn_key k = {};

	if (!report || !fk || !sf)
		return 0;
	/* Placed after the close was heard: the 4-tuple anew (a reset
	 * leaves no TIME_WAIT), not the subflow that closed. */
	if (sf->created_ns > report->heard_ns)
		return false;
	if (report->created_ns && sf->created_ns != report->created_ns)
		return false;
	if (!report->token)
		return true;
	/* Not learnt (a mirrored join whose connection was forgotten, a
	 * new subflow whose MP_CAPABLE ACK has not come yet): named only
	 * if older than any report that could still be about its 4-tuple's
	 * previous subflow. */
	if (!sf->conn)
		return report->heard_ns - sf->created_ns > REPORT_LATE_NS;
	k.family = fk->family;
	k.token = report->token;
	__builtin_memcpy(k.local, fk->saddr, 16);
	alias = bpf_map_lookup_elem(&conn_aliases, &k);
	/* A connection the datapath does not know (never learnt, or
	 * forgotten) cannot be checked; one it knows must be the entry's
	 * (a new subflow on the 4-tuple may not be learnt yet: conn 0). */
	return !alias || alias->canonical == sf->conn;
}

/* delete_subflow frees the entries of fk and takes them from their pod's
 * count; returns how many it freed. */
static __always_inline int delete_subflow(const struct flow_key *fk)
{
	struct subflow *sf = subflow_lookup(fk);
	__u32 slot = sf ? sf->pod_slot : 0;
	int freed;

	freed = table_delete(&subflows, SUBFLOW_TABLE_BITS, (const __u64 *)fk, FLOW_KEY_WORDS, SUBFLOW_WORDS);
	pod_subflows_take(slot, freed);
	return freed;
}

/* subflow_closed runs when the pod's kernel closed the subflow of key (the
 * agent, the pod's path manager, hears it, or its sweep finds no socket),
 * if report names it: the subflow's connection gets back what the subflow
 * held (give_back), so that a join opened to replace it is placed on the
 * path it leaves and counts against the rule's maximum as the closed one
 * did. Then the entry goes, as a delete (the result is the entries freed),
 * and an arrival the pod answered takes the 4-tuple (arrivals). The
 * subflow's path goes to *path: a replacement waits for it while it is
 * down (internal/agent/podnet/leave.go). */
static __always_inline int subflow_closed(const __u64 *key, const struct closed_report *report, __u32 *path)
{
	const struct flow_key *fk = (const struct flow_key *)key;
	struct arrival *waiting, a;
	struct subflow *sf;
	void *answers;
	struct conn *c = NULL;
	__u32 canonical = 0;
	int freed;

	sf = subflow_lookup(fk);
	if (!sf || !report_names(report, fk, sf))
		return 0;
	*path = sf->path_index;
	give_back(fk, sf);
	freed = delete_subflow(fk);
	/* The new subflow's segments counted on the old entry meanwhile: the
	 * peer's third ACK of the pod's answer is what this takes. */
	answers = pod_answers(true, fk->family, fk->saddr);
	waiting = answers ? bpf_map_lookup_elem(answers, fk) : NULL;
	if (answers && waiting && (waiting->state & ARRIVAL_ACKED)) {
		a = *waiting;
		if (bpf_map_delete_elem(answers, fk))
			return freed;
		c = lookup_conn(fk->family, fk->saddr, a.sf.token, &canonical);
		write_arrival(fk, &a.sf, c, canonical, true);
		seed_rate_subflow(fk, a.sf.rule, a.state);
		return freed;
	}
	answers = pod_answers(false, fk->family, fk->saddr);
	waiting = answers ? bpf_map_lookup_elem(answers, fk) : NULL;
	if (!answers || !waiting || !(waiting->state & ARRIVAL_ACKED))
		return freed;
	a = *waiting;
	if (bpf_map_delete_elem(answers, fk))
		return freed;
	write_arrival(fk, &a.sf, NULL, 0, true);
	seed_rate_subflow(fk, a.sf.rule, a.state);
	return freed;
}

/* subflow_op carries out a change user space asks of the subflow table,
 * keeping the entries per pod (not the programs' counters): a migration's
 * inserts count for their pods, never refused, and a delete takes its
 * entries back. */
static __always_inline int subflow_op(__u32 code, const struct flow_key *fk, const struct subflow *sf)
{
	struct subflow old = {};
	int result = -1;

	if (code == TABLE_OP_DELETE)
		return delete_subflow(fk);
	if (code != TABLE_OP_INSERT && code != TABLE_OP_INSERT_NEW)
		return -1;
	table_insert(&subflows, SUBFLOW_TABLE_BITS, (const __u64 *)fk, FLOW_KEY_WORDS, (const __u64 *)sf,
		     SUBFLOW_WORDS, code == TABLE_OP_INSERT, &result, (__u64 *)&old);
	pod_subflows_write(result, sf, &old);
	return result;
}

/* table_ctl is how user space changes the tables (table.h): the agent
 * forgetting subflows and a migration filling a new table run it with a
 * struct table_op as context (BPF_PROG_RUN). User space writes the tables
 * through nothing else. */
SEC("syscall")
int table_ctl(struct table_op *op)
{
	__u64 key[TABLE_KEY_WORDS_MAX], value[TABLE_VALUE_WORDS_MAX];
	__u32 code = op->op, table = op->table, closed_path = 0;
	int result = -1;

#pragma unroll
	for (int i = 0; i < TABLE_KEY_WORDS_MAX; i++)
		key[i] = op->key[i];
#pragma unroll
	for (int i = 0; i < TABLE_VALUE_WORDS_MAX; i++)
		value[i] = op->value[i];
	if (table == TABLE_ID_SUBFLOWS && code == TABLE_OP_SUBFLOW_CLOSED)
		result = subflow_closed(key, (const struct closed_report *)value, &closed_path);
	else if (table == TABLE_ID_SUBFLOWS)
		result = subflow_op(code, (const struct flow_key *)key, (const struct subflow *)value);
	else if (table == TABLE_ID_POLICE)
		result = table_run(&rate_buckets, POLICE_TABLE_BITS, code, key, RATE_KEY_WORDS, value,
				   RATE_BUCKET_WORDS);
	op->result = result;
	op->closed_path = closed_path;
	return 0;
}
