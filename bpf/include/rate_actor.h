/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The rate actor's logic (maps and types in rate.h). Included by datapath.c
 * after its helpers (count, observe_only, flow_key_from, lookup_conn). */
#pragma once

#include "rate.h"

#define NSEC_PER_SEC	  1000000000ULL
#define TCP_WINDOW_OFF	  14 /* offset of the window field in the TCP header */
#define TCP_CHECK_OFF	  16
#define RATE_CAS_RETRIES  4
#define RATE_WINDOW_FLOOR 1460 /* bytes: one full-sized segment on Ethernet */

/* rate_learn_syn records, from a SYN or SYN-ACK, whether its sender offered
 * window scaling and, for the pod's, with which shift: once per side, from
 * the first handshake packet of the subflow the datapath placed (its entry
 * starts with none learnt) or accepted (seeded from the arrival). A later
 * SYN or SYN-ACK on the live 4-tuple, which a pod can forge for its own
 * subflow or a neighbour's, changes nothing: a shift learnt anew would make
 * a window cap write windows for the wrong scale. */
static __always_inline void rate_learn_syn(const struct packet *pkt, const struct flow_key *fk, __u32 dir)
{
	struct rate_subflow fresh = {}, *rs;
	int shift = pkt->wscale ? pkt->wscale - 1 : -1;

	bpf_map_update_elem(&rate_subflows, fk, &fresh, BPF_NOEXIST);
	rs = bpf_map_lookup_elem(&rate_subflows, fk);
	if (!rs)
		return;
	if (rs->flags & (dir == RATE_DIR_EGRESS ? RATE_SF_POD_SYN : RATE_SF_PEER_SYN))
		return;
	if (dir == RATE_DIR_EGRESS) {
		rs->flags |= RATE_SF_POD_SYN;
		if (shift >= 0) {
			rs->flags |= RATE_SF_POD_WS;
			rs->pod_shift = shift;
		}
	} else {
		rs->flags |= RATE_SF_PEER_SYN;
		if (shift >= 0)
			rs->flags |= RATE_SF_PEER_WS;
	}
}

/* rate_learn_token keeps the connection's canonical token (the responder's,
 * as conn_states uses) from the MP_CAPABLE ACK's second key, so the initial
 * subflow and the joins share one per-connection bucket and window. */
static __always_inline void rate_learn_token(struct __sk_buff *skb, const struct packet *pkt,
					     struct rate_subflow *rs)
{
	__be32 key[2];

	if (bpf_skb_load_bytes(skb, (__u32)pkt->l4_off + pkt->mptcp.off[MPTCP_SUB_CAPABLE] + 12, key,
			       sizeof(key)))
		return;
	rs->conn_token = mptcp_token(bpf_ntohl(key[0]), bpf_ntohl(key[1]));
	rs->flags |= RATE_SF_TOKEN;
}

/* rate_conn_key names the connection a packet belongs to: its canonical
 * token when known (conn: the subflow entry's, 0 until learnt; or learnt
 * here, or a join's token through conn_aliases), else the subflow's ports. */
static __always_inline void rate_conn_key(struct rate_key *k, const struct flow_key *fk, __u32 conn,
					  struct rate_subflow *rs, __u32 join_token)
{
	__builtin_memcpy(k->addr, fk->saddr, 16);
	k->family = fk->family;
	if (conn) {
		k->kind = RATE_KEY_CONN;
		k->id = conn;
		return;
	}
	if (rs && (rs->flags & RATE_SF_TOKEN)) {
		k->kind = RATE_KEY_CONN;
		k->id = rs->conn_token;
		return;
	}
	if (join_token) {
		struct conn_key ck = {.family = fk->family, .token = join_token};
		struct conn_alias *alias;

		__builtin_memcpy(ck.local, fk->saddr, 16);
		alias = bpf_map_lookup_elem(&conn_aliases, &ck);
		if (alias) {
			k->kind = RATE_KEY_CONN;
			k->id = alias->canonical;
			if (rs) {
				rs->conn_token = alias->canonical;
				rs->flags |= RATE_SF_TOKEN;
			}
			return;
		}
	}
	k->kind = RATE_KEY_FLOW;
	k->id = ((__u32)bpf_ntohs(fk->sport) << 16) | bpf_ntohs(fk->dport);
}

/* police_bucket_new stores a new full bucket at k (its theoretical arrival
 * time now); two CPUs may create it at once, the second keeps the first's.
 * A global function: once per bucket, verified once, its frame its own. */
__noinline int police_bucket_new(const struct rate_key *k, __u64 now)
{
	struct rate_bucket fresh = {.tat_ns = now};
	int result;

	if (!k)
		return 0;
	table_insert(&rate_buckets, POLICE_TABLE_BITS, (const __u64 *)k, RATE_KEY_WORDS,
		     (const __u64 *)&fresh, RATE_BUCKET_WORDS, false, &result, NULL);
	if (result == TABLE_EVICTED)
		count(STAT_POLICE_EVICTED);
	return 0;
}

static __always_inline struct rate_bucket *police_lookup(const struct rate_key *k)
{
	return table_lookup(&rate_buckets, POLICE_TABLE_BITS, (const __u64 *)k, RATE_KEY_WORDS,
			    RATE_BUCKET_WORDS);
}

/* police_bucket returns the bucket at k, a new full one if there is none,
 * or NULL when the table could not store it (the packet then passes: never
 * a false drop). */
static __always_inline struct rate_bucket *police_bucket(const struct rate_key *k, __u64 now)
{
	struct rate_bucket *b = police_lookup(k);

	if (b)
		return b;
	police_bucket_new(k, now);
	return police_lookup(k);
}

/* rate_gcra_allow charges len bytes to the bucket at k (rate bps, constants
 * g, depth burst bytes) and says whether they fit. Generic cell rate
 * algorithm: tat is when the bucket would be empty again; a packet fits
 * while the backlog before it is at most the bucket's depth. Lock-free: one
 * compare-and-swap, retried a few times under contention, then let through
 * (never a false drop). */
static __always_inline bool rate_gcra_allow(const struct rate_key *k, __u64 bps, const struct rate_gcra *g,
					    __u64 burst, __u32 len, __u64 now)
{
	struct rate_bucket *b;
	__u64 cost, tau;

	if (bps == 0)
		return true;
	b = police_bucket(k, now);
	if (!b)
		return true;
	if (g->byte_cost) {
		__u32 shift = g->shift & 63;

		cost = ((__u64)len * g->byte_cost + (1ULL << shift) - 1) >> shift;
		tau = g->tau_ns;
	} else {
		cost = (__u64)len * 8 * NSEC_PER_SEC / bps;
		tau = burst * 8 * NSEC_PER_SEC / bps;
	}
	for (int i = 0; i < RATE_CAS_RETRIES; i++) {
		__u64 old = b->tat_ns, base = old > now ? old : now;

		if (base - now > tau)
			return false;
		if (__sync_val_compare_and_swap(&b->tat_ns, old, base + cost) == old)
			return true;
	}
	return true;
}

/* The shortest Ethernet frame: a smaller packet may come padded to it, and
 * the padding is not payload. */
#define ETH_ZLEN 60

/* rate_has_payload says whether a TCP segment carries data. */
static __always_inline bool rate_has_payload(const struct packet *pkt)
{
	__u32 hdr_end = (__u32)pkt->l4_off + pkt->tcp_hlen;

	return pkt->len > hdr_end && pkt->len > ETH_ZLEN;
}

/* rate_police_due says whether police charges pkt, going in direction dir:
 * the rule polices that direction, and the segment carries data. Only
 * segments with data are charged and dropped: dropping an ACK (a DATA_ACK, a
 * window update, a handshake's third ACK) saves no bandwidth and stalls the
 * connection. */
static __always_inline bool rate_police_due(const struct rate_cfg *cfg, const struct packet *pkt, __u32 dir)
{
	__u32 want = dir == RATE_DIR_EGRESS ? RATE_POLICE_EGRESS : RATE_POLICE_INGRESS;

	return (cfg->flags & want) && rate_has_payload(pkt);
}

/* rate_clock reads the clock police times its buckets with. */
static __always_inline __u64 rate_clock(const struct rate_cfg *cfg)
{
	return cfg->flags & RATE_COARSE_CLOCK ? bpf_ktime_get_coarse_ns() : bpf_ktime_get_ns();
}

/* rate_ns_allow charges len bytes, going in k->dir, to the namespace bucket
 * of the pod at k->addr (pod_namespaces: every pod of the namespace on the
 * node shares it, at the namespace's rate); true when they fit, or when the
 * pod has no namespace cap. k becomes the namespace bucket's key (its
 * callers are done with the pod's), and is the lookup's key on the way. A
 * global function with next to no frame: pod_egress's chain of calls has no
 * stack to spare, and inlined here the check would grow its callers'. */
__noinline int rate_ns_allow(struct rate_key *k, __u32 len, __u64 now)
{
	struct rate_ns *ns;

	if (!k)
		return 1;
	_Static_assert(__builtin_offsetof(struct rate_key, id) ==
			   __builtin_offsetof(struct pod_ns_key, family),
		       "pod_ns_key: a prefix of rate_key");
	k->id = k->family;
	ns = bpf_map_lookup_elem(&pod_namespaces, k);
	if (!ns)
		return 1;
	__builtin_memset(k->addr, 0, 16);
	k->family = 0;
	k->rule = 0;
	k->kind = RATE_KEY_NS;
	k->id = ns->id;
	return rate_gcra_allow(k, ns->bps, &ns->gcra, ns->burst_bytes, len, now);
}

/* rate_police returns TC_ACT_SHOT when a bucket of the packet's connection,
 * pod, pod's namespace or path is out of tokens, counting which (a
 * namespace's drop as its pod's). */
static __always_inline int rate_police(const struct packet *pkt, const struct rate_cfg *cfg,
				       struct rate_key *k, __u32 path, __u64 now)
{
	__u32 len = pkt->len, reason, rule = k->rule;

	if (!rate_gcra_allow(k, cfg->conn_bps, &cfg->conn_gcra, cfg->burst_bytes, len, now)) {
		reason = STAT_RATE_DROP_CONN;
		goto drop;
	}
	/* A pod's and a path's buckets are its rule's budgets'. */
	k->rule = rate_budget(cfg, rule);
	k->kind = RATE_KEY_POD;
	k->id = 0;
	if (!rate_gcra_allow(k, cfg->pod_bps, &cfg->pod_gcra, cfg->burst_bytes, len, now)) {
		reason = STAT_RATE_DROP_POD;
		goto drop;
	}
	if ((cfg->flags & RATE_NAMESPACE) && !rate_ns_allow(k, len, now)) {
		reason = STAT_RATE_DROP_POD;
		goto drop;
	}
	k->rule = rate_path_budget(cfg, rule);
	k->kind = RATE_KEY_PATH;
	k->id = path;
	__builtin_memset(k->addr, 0, 16);
	if (!rate_gcra_allow(k, cfg->path_bps[path & MAX_PATHS], &cfg->path_gcra[path & MAX_PATHS],
			     cfg->burst_bytes, len, now)) {
		reason = STAT_RATE_DROP_PATH;
		goto drop;
	}
	return TCX_NEXT;
drop:
	/* Observe-only: nothing is dropped, so no drop is counted. */
	if (observe_only()) {
		count(STAT_OBSERVED);
		return TCX_NEXT;
	}
	count(reason);
	return TC_ACT_SHOT;
}

/* rate_window_act lowers the window of an ACK the pod sends so that the
 * connection's right edge (DATA_ACK + window, RFC 8684 3.3.5: the window is
 * connection-level and relative to the DATA_ACK) advances no faster than the
 * cap: edge += rate x elapsed, kept within burst of the DATA_ACK. The field
 * is written as edge - DATA_ACK shifted by the pod's negotiated scale, only
 * when that is smaller than what the pod wrote. A global function (its own
 * stack frame, verified once); rs may be NULL. */
__noinline int rate_window_act(struct __sk_buff *skb, const struct packet *pkt, const struct rate_cfg *cfg,
			       const struct rate_subflow *rs, const struct rate_key *k)
{
	__u32 off, l4, shift = 0, da, allowed;
	struct rate_window fresh = {}, *w;
	__u8 dss[8];
	__be16 old_win, new_win;
	__u64 field, Bps, dt, adv, now;

	if (!skb || !pkt || !cfg || !k)
		return 0;
	off = (__u32)pkt->l4_off + pkt->mptcp.off[MPTCP_SUB_DSS];
	l4 = pkt->l4_off;
	Bps = cfg->conn_bps / 8;
	if (!(cfg->flags & RATE_HEADERS_MAY_BE_REWRITTEN) || Bps == 0)
		return 0;
	if ((pkt->tcp_flags & (TCP_FLAG_ACK | TCP_FLAG_SYN | TCP_FLAG_RST)) != TCP_FLAG_ACK)
		return 0;
	if (!has_mptcp(pkt, MPTCP_SUB_DSS))
		return 0;
	if (!rs ||
	    (rs->flags & (RATE_SF_POD_SYN | RATE_SF_PEER_SYN)) != (RATE_SF_POD_SYN | RATE_SF_PEER_SYN)) {
		count(STAT_RATE_NO_WSCALE);
		return 0;
	}
	if ((rs->flags & (RATE_SF_POD_WS | RATE_SF_PEER_WS)) == (RATE_SF_POD_WS | RATE_SF_PEER_WS))
		shift = rs->pod_shift & 0xf;
	if (bpf_skb_load_bytes(skb, off, dss, sizeof(dss)))
		return 0;
	if (!(dss[3] & MPTCP_DSS_DATA_ACK))
		return 0;
	if (dss[3] & MPTCP_DSS_DATA_ACK8) {
		/* The low 32 bits of an 8-octet DATA_ACK follow the high ones. */
		if (bpf_skb_load_bytes(skb, off + 8, &da, sizeof(da)))
			return 0;
	} else {
		__builtin_memcpy(&da, &dss[4], sizeof(da));
	}
	da = bpf_ntohl(da);
	if (bpf_skb_load_bytes(skb, l4 + TCP_WINDOW_OFF, &old_win, sizeof(old_win)))
		return 0;

	now = bpf_ktime_get_ns();
	w = bpf_map_lookup_elem(&rate_windows, k);
	if (!w) {
		fresh.edge = da + (__u32)cfg->burst_bytes;
		fresh.valid = 1;
		fresh.last_ns = now;
		bpf_map_update_elem(&rate_windows, k, &fresh, BPF_NOEXIST);
		now = bpf_ktime_get_ns();
		w = bpf_map_lookup_elem(&rate_windows, k);
		if (!w)
			return 0;
	} else {
		__u64 last = w->last_ns;
		__u32 edge = w->edge;

		dt = now - last;
		if (dt > NSEC_PER_SEC)
			dt = NSEC_PER_SEC;
		adv = Bps * dt / NSEC_PER_SEC;
		if ((__s32)(edge + (__u32)adv - da) > (__s32)cfg->burst_bytes) {
			/* Idle or slow: the grant never exceeds one burst. */
			w->edge = da + (__u32)cfg->burst_bytes;
			w->last_ns = now;
		} else if (adv) {
			/* ACKs of the connection's subflows run on several CPUs:
			 * whoever moves last_ns over the elapsed time adds its
			 * grant, so no interval is granted twice. The remainder
			 * of the time is kept, not lost. */
			if (__sync_val_compare_and_swap(&w->last_ns, last, last + adv * NSEC_PER_SEC / Bps) ==
			    last)
				__sync_fetch_and_add(&w->edge, (__u32)adv);
		}
	}
	/* The edge never lags behind the DATA_ACK: what the floor below let
	 * the peer send past it is not repaid (repaying it starved the
	 * connection on the test bed). */
	if ((__s32)(w->edge - da) < 0)
		w->edge = da;
	allowed = w->edge - da;
	/* A zero window stops the ACKs that would open it again: the pod's
	 * kernel believes it offered its own window and sends no update, and
	 * the peer waits for its persist timer (200 ms and more). One segment
	 * keeps the ACK clock running; the peer's delayed ACK of a lone
	 * segment then brings the edge's accrued grant. */
	if (allowed < RATE_WINDOW_FLOOR)
		allowed = RATE_WINDOW_FLOOR;

	/* Rounded up, so the floor survives the scale. */
	field = (allowed + (1U << shift) - 1) >> shift;
	if (field >= bpf_ntohs(old_win))
		return 0; /* never raise the window */
	if (observe_only()) {
		count(STAT_OBSERVED);
		return 0;
	}
	new_win = bpf_htons((__u16)field);
	if (bpf_l4_csum_replace(skb, l4 + TCP_CHECK_OFF, old_win, new_win, sizeof(new_win)))
		return 0;
	if (bpf_skb_store_bytes(skb, l4 + TCP_WINDOW_OFF, &new_win, sizeof(new_win), 0))
		return 0;
	count(STAT_RATE_WND_LOWERED);
	return 0;
}

/* rate_act's answer when police is due: k names the packet's connection. */
#define RATE_POLICE_DUE 1

/* rate_act runs the rate actor on a packet of the known subflow sf (its rule,
 * path and MP_JOIN token; fk its key, as the pod sends) going in direction
 * k->dir (RATE_DIR_*; the rest of k zero), but for police itself: it returns
 * RATE_POLICE_DUE with the connection's key in k when police is due,
 * TCX_NEXT otherwise. A global function: verified once, and its stack is its own.
 * The caller's flow key is passed rather than rebuilt, and the caller
 * polices in its own frame: pod_egress's frame, this one and the calls
 * under each must fit the 512-byte stack together. */
__noinline int rate_act(struct __sk_buff *skb, const struct packet *pkt, const struct flow_key *fk,
			const struct subflow *sf, struct rate_key *k)
{
	struct rate_subflow *rs = NULL;
	struct rate_cfg *cfg;
	__u32 rule, dir;

	if (!skb || !pkt || !fk || !sf || !k)
		return TCX_NEXT;
	rule = sf->rule;
	dir = k->dir;
	cfg = bpf_map_lookup_elem(&rate_rules, &rule);
	if (!cfg || (cfg->mode != RATE_MODE_WINDOW && cfg->mode != RATE_MODE_POLICE))
		return TCX_NEXT;
	if (pkt->tcp_flags & TCP_FLAG_SYN) {
		rate_learn_syn(pkt, fk, dir);
		/* A SYN carrying data (TCP Fast Open, or a raw socket's
		 * stream of them) is charged like any segment. */
		if (!rate_has_payload(pkt))
			return TCX_NEXT;
	}
	/* Police needs rate_subflows only to name the connection, which the
	 * subflow entry knows once learnt: one hash lookup less per packet.
	 * The window actor always needs it (the pod's window scale). */
	if (cfg->mode == RATE_MODE_WINDOW || !sf->conn) {
		rs = bpf_map_lookup_elem(&rate_subflows, fk);
		if (rs && !(rs->flags & RATE_SF_TOKEN) && has_mptcp(pkt, MPTCP_SUB_CAPABLE))
			rate_learn_token(skb, pkt, rs);
	}

	k->rule = rule;
	rate_conn_key(k, fk, sf->conn, rs, sf->token);
	if (cfg->mode == RATE_MODE_WINDOW) {
		if (dir == RATE_DIR_EGRESS)
			rate_window_act(skb, pkt, cfg, rs, k);
		return TCX_NEXT;
	}
	if (!rate_police_due(cfg, pkt, dir))
		return TCX_NEXT;
	return RATE_POLICE_DUE;
}

/* rate_packet runs the rate actor on a packet of the known subflow sf (see
 * rate_act) and returns TC_ACT_SHOT to drop, TCX_NEXT otherwise. Policing
 * the data of a learnt connection, nearly every packet a police rule sees,
 * is done here, inline; handshakes, the window mode and connections not
 * learnt yet go to rate_act first. */
static __always_inline int rate_packet(struct __sk_buff *skb, const struct packet *pkt,
				       const struct flow_key *fk, const struct subflow *sf, __u32 dir)
{
	__u32 rule = sf->rule;
	struct rate_cfg *cfg = bpf_map_lookup_elem(&rate_rules, &rule);
	struct rate_key k = {};

	if (!cfg || (cfg->mode != RATE_MODE_WINDOW && cfg->mode != RATE_MODE_POLICE))
		return TCX_NEXT; /* most subflows: no key built */
	k.dir = dir;
	if (cfg->mode != RATE_MODE_POLICE || !sf->conn || (pkt->tcp_flags & TCP_FLAG_SYN)) {
		if (rate_act(skb, pkt, fk, sf, &k) != RATE_POLICE_DUE)
			return TCX_NEXT;
	} else {
		if (!rate_police_due(cfg, pkt, dir))
			return TCX_NEXT;
		k.rule = rule;
		rate_conn_key(&k, fk, sf->conn, NULL, 0);
	}
	return rate_police(pkt, cfg, &k, subflow_path(sf), rate_clock(cfg));
}

/* A pod's per-pod cap holds for everything it sends and receives over its
 * rules' paths, whatever the protocol: plain TCP and UDP beside its MPTCP
 * connections, a connection that fell back, a subflow whose table entry was
 * evicted. Such a packet has no subflow entry to name its rule, so the rule
 * whose cap governs it is the pod's cap rule on the path it travels: the
 * first of the pod's chain that has the path and caps the pod in that way.
 * What the pod sends is capped where it leaves a path's NIC (nic_egress),
 * what it receives where it enters the pod (pod_ingress), by the path it
 * arrived on. */

/* detour.h: whether path is in rule_id's list. */
__noinline int rule_has_path(__u32 rule_id, __u32 path);

/* pod_cap_rule returns the id of the pod's cap rule on path (see above) for
 * mode: police in the direction of flag, or shape, capping the pod or its
 * namespace; -1 when none caps it. */
static __always_inline int pod_cap_rule(const struct endpoint *ep, __u32 path, __u32 mode, __u32 flag,
					struct rate_cfg **out)
{
	for (__u32 i = 0; i < MAX_POD_RULES; i++) {
		struct rate_cfg *cfg;
		__u32 id;

		if (i >= ep->nrules)
			break;
		id = ep->rules[i];
		cfg = bpf_map_lookup_elem(&rate_rules, &id);
		if (!cfg || cfg->mode != mode || (!cfg->pod_bps && !(cfg->flags & RATE_NAMESPACE)) ||
		    (flag && !(cfg->flags & flag)))
			continue;
		if (!rule_has_path(id, path))
			continue;
		*out = cfg;
		return id;
	}
	return -1;
}

/* rate_pod_police charges len bytes a pod sends or receives on path, a
 * packet no subflow entry names, to its cap rule's pod bucket: the pod's
 * endpoint is ep, k holds its address and family and the direction. Returns
 * TC_ACT_SHOT when the bucket is out of tokens. A global function: verified
 * once, off the subflows' fast path. */
__noinline int rate_pod_police(const struct endpoint *ep, struct rate_key *k, __u32 len, __u32 path)
{
	struct rate_cfg *cfg = NULL;
	__u32 flag;
	__u64 now;
	int id;

	if (!ep || !k)
		return TCX_NEXT;
	flag = k->dir == RATE_DIR_EGRESS ? RATE_POLICE_EGRESS : RATE_POLICE_INGRESS;
	id = pod_cap_rule(ep, path, RATE_MODE_POLICE, flag, &cfg);
	if (id < 0 || !cfg)
		return TCX_NEXT;
	k->rule = rate_budget(cfg, id);
	k->kind = RATE_KEY_POD;
	k->id = 0;
	now = rate_clock(cfg);
	if (rate_gcra_allow(k, cfg->pod_bps, &cfg->pod_gcra, cfg->burst_bytes, len, now) &&
	    (!(cfg->flags & RATE_NAMESPACE) || rate_ns_allow(k, len, now)))
		return TCX_NEXT;
	if (observe_only()) {
		count(STAT_OBSERVED);
		return TCX_NEXT;
	}
	count(STAT_RATE_DROP_POD);
	return TC_ACT_SHOT;
}

/* pod_rate_key starts the key of a pod's bucket: its address and family, the
 * direction. */
static __always_inline void pod_rate_key(struct rate_key *k, const __u8 *addr, __u8 family, __u32 dir)
{
	__builtin_memcpy(k->addr, addr, 16);
	k->family = family;
	k->dir = dir;
}

/* set_class sends a packet leaving a path's NIC to the agent's HTB class
 * classid (skb->priority), but in observe-only mode. */
static __always_inline void set_class(struct __sk_buff *skb, __u32 classid)
{
	if (observe_only()) {
		count(STAT_OBSERVED);
		return;
	}
	skb->priority = classid;
	count(STAT_RATE_SHAPED);
}

/* set_pod_class sends a packet leaving a path's NIC to its pod's HTB class
 * on the shaping device (rate_classes): through the NIC's class that
 * redirects there, the pod's minor in tc_index, which nic_egress on the
 * shaping device turns into its class. */
static __always_inline void set_pod_class(struct __sk_buff *skb, __u32 classid)
{
	if (observe_only()) {
		count(STAT_OBSERVED);
		return;
	}
	skb->tc_index = classid & 0xffff;
	skb->priority = (SHAPE_MAJOR << 16) | SHAPE_MINOR_VIA_IFB;
	count(STAT_RATE_SHAPED);
}

/* rate_pod_classify gives a packet the pod at addr sends on path, one no
 * subflow entry names, the HTB class of its shape cap rule's pod class. */
static __always_inline void rate_pod_classify(struct __sk_buff *skb, const struct endpoint *ep,
					      const __u8 *addr, __u32 family, __u32 path)
{
	struct rate_key k = {.family = family, .kind = RATE_KEY_POD, .id = path};
	struct rate_cfg *cfg = NULL;
	__u32 *classid;
	int id;

	id = pod_cap_rule(ep, path, RATE_MODE_SHAPE, 0, &cfg);
	if (id < 0 || !cfg)
		return;
	k.rule = rate_budget(cfg, id);
	__builtin_memcpy(k.addr, addr, 16);
	classid = bpf_map_lookup_elem(&rate_classes, &k);
	if (classid)
		set_pod_class(skb, *classid);
}

/* rate_classify gives a packet leaving a path's NIC the HTB class the agent
 * made for its pod (on the shaping device), or else for its rule on that
 * path: its rule's budget's. A packet the shaping device gave back
 * (returned) passed its pod's class: it takes its rule's path class, if
 * any (else it keeps SHAPE_MINOR_FROM_IFB, which nic_egress gave it). */
static __always_inline void rate_classify(struct __sk_buff *skb, const struct packet *pkt, __u32 rule,
					  __u32 path, bool returned)
{
	struct rate_key k = {.family = pkt->family, .kind = RATE_KEY_POD, .id = path};
	struct rate_cfg *cfg = bpf_map_lookup_elem(&rate_rules, &rule);
	__u32 *classid;

	if (!cfg || cfg->mode != RATE_MODE_SHAPE)
		return;
	k.rule = rate_budget(cfg, rule);
	__builtin_memcpy(k.addr, pkt->saddr, 16);
	if (!returned) {
		classid = bpf_map_lookup_elem(&rate_classes, &k);
		if (classid) {
			set_pod_class(skb, *classid);
			return;
		}
	}
	__builtin_memset(k.addr, 0, 16);
	k.family = 0;
	k.kind = RATE_KEY_PATH;
	classid = bpf_map_lookup_elem(&rate_classes, &k);
	if (classid)
		set_class(skb, *classid);
}
