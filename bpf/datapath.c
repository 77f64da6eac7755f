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
 *   nic_egress  (TC egress of a path's NIC)
 *       a selected pod's packet  -> shape: the HTB class of its pod or path
 *   nic_ingress (TC ingress of a path's NIC)
 *       anything for a selected pod -> mark with the NIC's path (reverse-path
 *                                   filtering with src_valid_mark then sees
 *                                   the path's table)
 *       SYN opening a subflow    -> record the arrival path, so the pod's
 *                                   replies leave by the same NIC, and count
 *                                   the path as used by the connection
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

#include "common.h"
#include "parse.h"
#include "sha256.h"
#include "rate.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Which bits of skb->mark are ours, set by the agent before load. Other bits
 * belong to kube-proxy, the CNI and others and are preserved. */
volatile const __u32 mark_mask = 0x00f00000;
volatile const __u32 mark_shift = 20;

/* Keeps enum stat_id in BTF so bpf2go emits it for the agent. */
const enum stat_id *unused_stat_id __attribute__((unused));
/* Keeps enum mptcp_subtype in BTF, so a test checks Go's subtypes against it. */
const enum mptcp_subtype *unused_mptcp_subtype __attribute__((unused));
/* Keeps enum rate_mode in BTF, so Go takes the modes from it. */
const enum rate_mode *unused_rate_mode __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct subflow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} subflows SEC(".maps");

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

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32); /* ifindex */
	__type(value, struct nic);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nics SEC(".maps");

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

static __always_inline void count(__u32 id)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &id);

	if (v)
		*v += 1;
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

/* record_mptcp_options counts, per subtype, the packets that carry a valid
 * option of that subtype and those that carry one with an undefined length.
 * A global function: the verifier checks it once, on its own, instead of
 * once for every state of every calling program that reaches it. */
__noinline int record_mptcp_options(__u32 seen, __u32 invalid)
{
	if (invalid)
		count(STAT_MPTCP_OPT_INVALID);
	for (__u32 i = 0; i < MPTCP_SUBTYPES; i++) {
		struct mptcp_subtype_stats *st;
		__u32 bit = 1U << i;

		if (!((seen | invalid) & bit))
			continue;
		st = bpf_map_lookup_elem(&mptcp_options, &i);
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
	return (__u32)pkt->l4_off + pkt->mptcp_off[subtype];
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

static __always_inline void set_path_mark(struct __sk_buff *skb, __u32 path)
{
	__u32 value = ((path + 1) << mark_shift) & mark_mask;

	if (observe_only()) {
		count(STAT_OBSERVED);
		return;
	}
	skb->mark = (skb->mark & ~mark_mask) | value;
	count(STAT_MARKED);
}

static __always_inline struct endpoint *lookup_endpoint(__u8 family, const __u8 addr[16])
{
	struct endpoint_key k = {.family = family};

	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&endpoints, &k);
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

static __always_inline struct conn *lookup_conn(__u8 family, const __u8 local[16], __u32 token)
{
	struct conn_key k = {.family = family, .token = token};
	struct conn_alias *alias;

	__builtin_memcpy(k.local, local, 16);
	alias = bpf_map_lookup_elem(&conn_aliases, &k);
	if (!alias)
		return NULL;
	k.token = alias->canonical;
	return bpf_map_lookup_elem(&conn_states, &k);
}

/* learn_connection records a connection from its MP_CAPABLE ACK, which in v1
 * carries the sender's (initiator's) and the receiver's (responder's) keys
 * (RFC 8684 section 3.1, figure 4). It runs on both nodes: on the initiator's
 * as the ACK leaves the pod, on the responder's as it arrives. Either way it
 * runs before the ACK reaches the other pod and before the local pod can open
 * a join, so every join's token is known when the join arrives. The keys are
 * used here and dropped: only tokens are kept. */
static __always_inline void learn_connection(struct __sk_buff *skb, const struct packet *pkt,
					     const __u8 local[16], __u32 path)
{
	struct conn_key k = {.family = pkt->family};
	struct conn_alias alias = {};
	struct conn c = {};
	__be32 keys[4];
	__u32 initiator_token, responder_token;

	/* Not on a SYN, the parser accepted only the forms with both keys:
	 * ACK, length 20; with data: 22, or 24 with a checksum. */
	if (!is_capable_ack(pkt))
		return;
	if (bpf_skb_load_bytes(skb, mptcp_offset(pkt, MPTCP_SUB_CAPABLE) + 4, keys, sizeof(keys)))
		return;
	responder_token = mptcp_token(bpf_ntohl(keys[2]), bpf_ntohl(keys[3]));
	__builtin_memcpy(k.local, local, 16);
	k.token = responder_token;
	/* The ACK is repeated on data until acknowledged: learn once. */
	if (bpf_map_lookup_elem(&conn_aliases, &k))
		return;
	initiator_token = mptcp_token(bpf_ntohl(keys[0]), bpf_ntohl(keys[1]));

	c.used = 1U << (path & MAX_PATHS);
	bpf_map_update_elem(&conn_states, &k, &c, BPF_NOEXIST);
	alias.canonical = responder_token;
	bpf_map_update_elem(&conn_aliases, &k, &alias, BPF_NOEXIST);
	k.token = initiator_token;
	bpf_map_update_elem(&conn_aliases, &k, &alias, BPF_NOEXIST);
	count(STAT_TOKEN_LEARNT);
}

/* claim_path takes, for a join, the first path of the rule (starting at a
 * per-connection cursor) that no subflow of the connection uses yet. Bits are
 * claimed with an atomic OR, so two joins placed at once on two CPUs, or a
 * join placed here while the peer's node mirrors one of its own, never both
 * get the same free path. */
static __always_inline __u32 claim_path(struct rule *r, struct conn *c, __u32 npaths)
{
	__u32 start = __sync_fetch_and_add(&c->joins, 1);

	for (__u32 i = 0; i < MAX_PATHS; i++) {
		__u32 slot, path, bit;

		if (i >= npaths)
			break;
		slot = (start + i) % npaths;
		asm volatile("" : "+r"(slot));
		path = r->paths[slot & MAX_PATHS] & MAX_PATHS;
		bit = 1U << path;
		if (!(__sync_fetch_and_or(&c->used, bit) & bit))
			return path;
	}
	/* More subflows than paths: share, round robin. */
	count(STAT_PATHS_EXHAUSTED);
	start %= npaths;
	asm volatile("" : "+r"(start));
	return r->paths[start & MAX_PATHS] & MAX_PATHS;
}

/* place_subflow chooses the path of a new subflow the pod opens. */
static __always_inline int place_subflow(struct __sk_buff *skb, const struct packet *pkt, __u32 rule_id,
					 struct rule *r, struct subflow *sf)
{
	__u32 npaths = r->npaths;
	__u32 slot;

	if (npaths == 0 || npaths > MAX_PATHS) {
		count(STAT_NO_PATH);
		return -1;
	}

	if (handshake_subtype(pkt) == MPTCP_SUB_JOIN) {
		struct conn *c;
		__u32 token;

		count(STAT_JOIN_SYN);
		if (load_join_token(skb, pkt, &token))
			return -1;
		sf->token = token;
		c = lookup_conn(pkt->family, pkt->saddr, token);
		if (c) {
			sf->path = claim_path(r, c, npaths);
			count(STAT_JOIN_TOKEN_KNOWN);
			goto placed;
		}
		count(STAT_JOIN_TOKEN_UNKNOWN);
	} else {
		count(STAT_MPTCP_SYN);
	}
	slot = __sync_fetch_and_add(&r->rr, 1) % npaths;
	/* The compiler knows slot < npaths and would drop a plain mask; the
	 * verifier does not know it, so hide slot from the compiler first. */
	asm volatile("" : "+r"(slot));
	sf->path = r->paths[slot & MAX_PATHS];
placed:
	sf->role = ROLE_INITIATOR;
	sf->rule = rule_id;
	sf->created_ns = bpf_ktime_get_ns();
	count(STAT_SUBFLOW_PLACED);
	return 0;
}

static __always_inline void flow_key_from(struct flow_key *k, const struct packet *pkt, bool reverse)
{
	k->family = pkt->family;
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
	if (ret == PARSE_NOT_TCP)
		count(STAT_NOT_TCP);
	else if (ret == PARSE_MALFORMED)
		count(STAT_MALFORMED);
	else if (pkt->mptcp_seen | pkt->mptcp_invalid)
		record_mptcp_options(pkt->mptcp_seen, pkt->mptcp_invalid);
	return ret;
}

#include "rate_actor.h"

SEC("tc")
int pod_egress(struct __sk_buff *skb)
{
	struct packet pkt = {};
	struct flow_key fk = {};
	struct subflow *sf, nsf = {};
	struct endpoint *ep;
	struct rule *r;
	__u32 rule_id;

	if (parse_counted(skb, &pkt) != PARSE_OK)
		return TCX_NEXT;

	flow_key_from(&fk, &pkt, false);
	sf = bpf_map_lookup_elem(&subflows, &fk);
	if (sf) {
		if (is_capable_ack(&pkt) && sf->role == ROLE_INITIATOR)
			learn_connection(skb, &pkt, pkt.saddr, sf->path);
		if (rate_act(skb, &pkt, sf->rule, RATE_WHERE(sf->path, RATE_DIR_EGRESS), sf->token) ==
		    TC_ACT_SHOT)
			return TC_ACT_SHOT;
		set_path_mark(skb, sf->path);
		count_path(sf->path, pkt.len, true);
		return TCX_NEXT;
	}

	if (!is_opening_syn(&pkt))
		return TCX_NEXT;
	if (handshake_subtype(&pkt) == MPTCP_SUB_NONE)
		return TCX_NEXT;
	ep = lookup_endpoint(pkt.family, pkt.saddr);
	if (!ep)
		return TCX_NEXT;
	rule_id = ep->rule;
	r = bpf_map_lookup_elem(&rules, &rule_id);
	if (!r)
		return TCX_NEXT;
	if (place_subflow(skb, &pkt, rule_id, r, &nsf))
		return TCX_NEXT;

	bpf_map_update_elem(&subflows, &fk, &nsf, BPF_ANY);
	rate_act(skb, &pkt, rule_id, RATE_WHERE(nsf.path, RATE_DIR_EGRESS), nsf.token);
	set_path_mark(skb, nsf.path);
	count_path(nsf.path, pkt.len, true);
	return TCX_NEXT;
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

	if (parse_counted(skb, &pkt) != PARSE_OK)
		return TCX_NEXT;
	flow_key_from(&fk, &pkt, true);
	sf = bpf_map_lookup_elem(&subflows, &fk);
	if (!sf)
		return TCX_NEXT;
	return rate_act(skb, &pkt, sf->rule, RATE_WHERE(sf->path, RATE_DIR_INGRESS), sf->token);
}

SEC("tc")
int nic_ingress(struct __sk_buff *skb)
{
	struct packet pkt = {};
	struct flow_key fk = {};
	struct subflow nsf = {};
	__u32 ifindex = skb->ingress_ifindex;
	struct endpoint *ep;
	struct nic *n;

	n = bpf_map_lookup_elem(&nics, &ifindex);
	if (!n)
		return TCX_NEXT;
	if (parse_counted(skb, &pkt) != PARSE_OK)
		return TCX_NEXT;
	ep = lookup_endpoint(pkt.family, pkt.daddr);
	if (!ep)
		return TCX_NEXT;

	set_path_mark(skb, n->path);
	count_path(n->path, pkt.len, false);

	if (is_capable_ack(&pkt)) {
		struct subflow *sf;

		flow_key_from(&fk, &pkt, true);
		sf = bpf_map_lookup_elem(&subflows, &fk);
		if (sf && sf->role == ROLE_RESPONDER)
			learn_connection(skb, &pkt, pkt.daddr, sf->path);
		return TCX_NEXT;
	}
	if (!is_opening_syn(&pkt))
		return TCX_NEXT;
	if (handshake_subtype(&pkt) == MPTCP_SUB_NONE)
		return TCX_NEXT;

	/* The peer's node chose this path; the pod's replies follow it, and
	 * the pod's own joins avoid it. */
	if (handshake_subtype(&pkt) == MPTCP_SUB_JOIN) {
		struct conn *c;
		__u32 token;

		if (!load_join_token(skb, &pkt, &token)) {
			nsf.token = token;
			c = lookup_conn(pkt.family, pkt.daddr, token);
			if (c)
				__sync_fetch_and_or(&c->used, 1U << (n->path & MAX_PATHS));
		}
	}
	flow_key_from(&fk, &pkt, true);
	nsf.path = n->path;
	nsf.role = ROLE_RESPONDER;
	nsf.rule = ep->rule;
	nsf.created_ns = bpf_ktime_get_ns();
	bpf_map_update_elem(&subflows, &fk, &nsf, BPF_ANY);
	count(STAT_SUBFLOW_MIRRORED);
	return TCX_NEXT;
}

/* nic_egress runs on the TC egress of each path's NIC: the shape actor
 * classifies a selected pod's packets into the agent's HTB class there,
 * because forwarding from the pod's veth resets skb->priority. */
SEC("tc")
int nic_egress(struct __sk_buff *skb)
{
	struct packet pkt = {};
	__u32 ifindex = skb->ifindex;
	struct endpoint *ep;
	struct nic *n;

	n = bpf_map_lookup_elem(&nics, &ifindex);
	if (!n)
		return TCX_NEXT;
	/* Not counted: pod_egress counted these packets already. */
	if (parse_packet(skb, &pkt) != PARSE_OK)
		return TCX_NEXT;
	ep = lookup_endpoint(pkt.family, pkt.saddr);
	if (!ep)
		return TCX_NEXT;
	rate_classify(skb, &pkt, ep->rule, n->path);
	return TCX_NEXT;
}
