/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The backup actor. The MP_JOIN B bit changes only what the receiver of the
 * packet believes: it steers the receiver's sending. So each node protects
 * its own pods' sending by rewriting joins going into its pods (docs/datapath.md,
 * "Backup actor"): the SYN-ACK answering a join the pod opened, and the SYN of a
 * join the peer opened. Included by datapath.c after its helpers (count,
 * observe_only, rule_nactive). */
#pragma once

#include "parse.h"

#define MPTCP_JOIN_BACKUP 0x01 /* B, the low bit of MP_JOIN's subtype byte (RFC 8684 3.2) */
#define TCP_CSUM_OFF	  16

/* ip_len_matches says whether the IP header's length (IPv4 total length,
 * IPv6 payload length after the fixed header) ends the packet exactly where
 * the skb does. Rewriters act only then: a packet whose lengths disagree is
 * malformed and passes untouched (after the IP layer they always agree). */
static __always_inline bool ip_len_matches(struct __sk_buff *skb, const struct packet *pkt)
{
	__u32 l3 = pkt->l3_off;
	__be16 len;

	if (bpf_skb_load_bytes(skb, l3 + (pkt->family == AF_INET ? 2 : 4), &len, sizeof(len)))
		return false;
	if (pkt->family == AF_INET)
		return l3 + bpf_ntohs(len) == skb->len;
	return l3 + 40 + bpf_ntohs(len) == skb->len;
}

/* backup_path says whether path is one of the backup paths of rule r. */
static __always_inline bool backup_path(const struct rule *r, __u32 path)
{
	__u32 nact = rule_nactive(r);

	for (__u32 i = 0; i < MAX_PATHS; i++) {
		if (i >= r->npaths)
			break;
		if (i >= nact && rule_path(r, i) == path)
			return true;
	}
	return false;
}

/* join_into_pod says whether pkt, going into the pod on subflow sf, is the
 * SYN-ACK of a join the pod opened or the SYN of a join the peer opened: the
 * two packets whose B bit sets the pod's view of the subflow. */
static __always_inline bool join_into_pod(const struct packet *pkt, const struct subflow *sf)
{
	__u8 syn_ack = pkt->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST);

	if (!has_mptcp(pkt, MPTCP_SUB_JOIN))
		return false;
	if (sf->role == ROLE_INITIATOR)
		return syn_ack == (TCP_FLAG_SYN | TCP_FLAG_ACK);
	return syn_ack == TCP_FLAG_SYN;
}

/* B_SET_ALREADY and B_SET_CHANGED are what set_backup_bit did; anything
 * else (a negative value) left the packet as it was. */
#define B_SET_ALREADY 0
#define B_SET_CHANGED 1

/* set_backup_bit sets B, the low bit of the subtype byte of the MPTCP option
 * of subtype at pkt->mptcp.off[subtype] (MP_JOIN or MP_PRIO, whose byte
 * layouts agree there), in the 16-bit word of the TCP header holding it,
 * and updates the checksum from that word with the kernel's helper (right
 * under checksum offload too). In observe-only mode it counts and changes
 * nothing. */
static __always_inline int set_backup_bit(struct __sk_buff *skb, const struct packet *pkt, __u32 subtype)
{
	__u32 l4 = pkt->l4_off, byte, word;
	__be16 old, new;
	__u8 w[2];

	byte = pkt->mptcp.off[subtype & (MPTCP_SUBTYPES - 1)] + 2; /* from the TCP header */
	word = byte & ~1U;
	if (bpf_skb_load_bytes(skb, l4 + word, w, sizeof(w)))
		return -1;
	__builtin_memcpy(&old, w, sizeof(old));
	/* A branch, not an index: the verifier refuses pointer arithmetic with
	 * an OR. */
	if (byte & 1)
		w[1] |= MPTCP_JOIN_BACKUP;
	else
		w[0] |= MPTCP_JOIN_BACKUP;
	__builtin_memcpy(&new, w, sizeof(new));
	if (new == old)
		return B_SET_ALREADY;
	if (observe_only()) {
		count(STAT_OBSERVED);
		return -1;
	}
	if (bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, old, new, sizeof(new)))
		return -1;
	if (bpf_skb_store_bytes(skb, l4 + word, w, sizeof(w), 0))
		return -1;
	count(STAT_BACKUP_FLAGGED);
	return B_SET_CHANGED;
}

/* may_flag_backup says whether the backup actor may set B on pkt, going
 * into the pod on subflow sf: the admin allowed header rewriting in sf's
 * rule, sf's path is a backup path of it, and the packet is well formed. */
static __always_inline bool may_flag_backup(struct __sk_buff *skb, const struct packet *pkt,
					    const struct subflow *sf)
{
	__u32 rule_id = sf->rule;
	struct rule *r = bpf_map_lookup_elem(&rules, &rule_id);

	return r && (r->flags & RULE_REWRITE_HEADERS) && backup_path(r, sf->path_index) &&
	       ip_len_matches(skb, pkt);
}

/* backup_act sets B on a join into the pod whose subflow is on a backup path
 * of its rule, when the admin allowed header rewriting. A global function:
 * verified once, its own stack frame. */
__noinline int backup_act(struct __sk_buff *skb, const struct packet *pkt, struct subflow *sf)
{
	int ret;

	if (!skb || !pkt || !sf || !join_into_pod(pkt, sf) || !may_flag_backup(skb, pkt, sf))
		return 0;
	ret = set_backup_bit(skb, pkt, MPTCP_SUB_JOIN);
	if (ret == B_SET_ALREADY)
		/* The sender asked for backup itself. */
		__sync_fetch_and_or(&sf->flags, SUBFLOW_BACKUP);
	else if (ret == B_SET_CHANGED)
		__sync_fetch_and_or(&sf->flags, SUBFLOW_BACKUP | SUBFLOW_BACKUP_BY_US);
	return 0;
}

/* backup_prio_keep keeps a subflow on a backup path of its rule a backup in
 * the pod, under the header-rewriting opt-in, when an MP_PRIO going into the
 * pod says otherwise: its B is set again. The peer's path manager sends one
 * with B=0 when it makes a join it held as backup active (docs/subflows.md,
 * "Held joins"), and a peer may send one at will; either would make the
 * backup path an active one for the pod's sending. An MP_PRIO on an active
 * path passes as it is: a peer that asks for backup there is obeyed, as its
 * joins' B is. A global function: verified once, its own stack frame. */
__noinline int backup_prio_keep(struct __sk_buff *skb, const struct packet *pkt, struct subflow *sf)
{
	if (!skb || !pkt || !sf || !has_mptcp(pkt, MPTCP_SUB_PRIO) || !may_flag_backup(skb, pkt, sf))
		return 0;
	switch (set_backup_bit(skb, pkt, MPTCP_SUB_PRIO)) {
	case B_SET_CHANGED:
		__sync_fetch_and_or(&sf->flags, SUBFLOW_BACKUP | SUBFLOW_BACKUP_BY_US);
		break;
	case B_SET_ALREADY:
		/* The peer asked for backup itself: withdrawing the opt-in
		 * must not undo it. */
		__sync_fetch_and_and(&sf->flags, ~SUBFLOW_BACKUP_BY_US);
		__sync_fetch_and_or(&sf->flags, SUBFLOW_BACKUP);
		break;
	}
	return 0;
}

#define MPTCP_LEN_PRIO_V1 3 /* kind, length, subtype|B: RFC 8684 3.3.8, no address id */
#define TCP_HDR_MAX	  60
#define TCP_DOFF_WORD	  12 /* data offset and flags: the 16-bit word of the header holding doff */
#define IPV4_TOT_LEN_OFF  2
#define IPV4_CSUM_OFF	  10
#define IPV6_PLEN_OFF	  4

/* backup_want is the B the pod should hold for sf under rule r: with the
 * header-rewriting opt-in, whether its path is a backup path of r; without
 * it (withdrawn since, or the rule gone), not backup if this datapath made it
 * so, and otherwise whatever the pod holds (nothing to take back). */
static __always_inline __u32 backup_want(const struct rule *r, const struct subflow *sf)
{
	if (r && (r->flags & RULE_REWRITE_HEADERS))
		return backup_path(r, sf->path_index) ? 1 : 0;
	if (sf->flags & SUBFLOW_BACKUP_BY_US)
		return 0;
	return sf->flags & SUBFLOW_BACKUP ? 1 : 0;
}

/* backup_prio_act tells the pod, with an MP_PRIO on a pure ACK going into it,
 * that the subflow's path became a backup path of its rule after the join
 * (B=1) or stopped being one (B=0), once per change; and, when the rule's
 * header-rewriting opt-in is withdrawn, undoes a backup this datapath made
 * (B=0), so that no rewrite outlives the admin's consent. A pure ACK (no data,
 * no SYN, FIN or RST, so never GSO) carries in-window sequence numbers and
 * the peer's own timestamp, so the pod's kernel accepts it. The option is
 * added at the tail of the TCP header, which is the tail of the packet: the
 * packet grows by 4 bytes (the option and a NOP), and the data offset, the
 * IP length and both checksums follow, each through the kernel's helpers. An
 * ACK whose options leave no room the pod reads (full, or ended early by an
 * EOL or a broken option) passes as it is and is counted; the next one tries
 * again. A global function: verified once, its own stack frame. */
__noinline int backup_prio_act(struct __sk_buff *skb, const struct packet *pkt, struct subflow *sf)
{
	__u32 rule_id, l4, l3, hdr_len, tcp_len, want;
	__u8 opt[4], w[2], doff;
	__be16 old_w, new_w, old_len, new_len;
	__s64 diff;
	struct rule *r;

	if (!skb || !pkt || !sf)
		return 0;
	if ((pkt->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST | TCP_FLAG_ACK)) != TCP_FLAG_ACK)
		return 0;
	/* One carrying the peer's own MP_PRIO is left to it (backup_prio_keep):
	 * two in one packet would leave the pod to pick one. The next ACK
	 * carries ours. */
	if (has_mptcp(pkt, MPTCP_SUB_PRIO))
		return 0;
	rule_id = sf->rule;
	r = bpf_map_lookup_elem(&rules, &rule_id);
	want = backup_want(r, sf);
	if (want == (sf->flags & SUBFLOW_BACKUP ? 1U : 0U))
		return 0;
	l4 = pkt->l4_off;
	l3 = pkt->l3_off;
	if (bpf_skb_load_bytes(skb, l4 + TCP_DOFF_WORD, w, sizeof(w)))
		return 0;
	doff = w[0] >> 4;
	hdr_len = (__u32)doff * 4;
	if (pkt->len != l4 + hdr_len || skb->gso_segs > 1 || !ip_len_matches(skb, pkt))
		return 0; /* carries data (or trailing bytes): not a pure ACK */
	/* No room: the options are full, or the pod's kernel stops reading
	 * them before the tail (an EOL, a broken option), where the MP_PRIO
	 * would go unread. */
	if (hdr_len + sizeof(opt) > TCP_HDR_MAX || (pkt->mptcp.flags & (OPTS_END_EOL | OPTS_END_BROKEN))) {
		count(STAT_BACKUP_PRIO_NO_ROOM);
		return 0;
	}
	if (observe_only()) {
		count(STAT_OBSERVED);
		return 0;
	}
	tcp_len = hdr_len; /* pure ACK: the TCP length is the header's */
	opt[0] = TCPOPT_MPTCP;
	opt[1] = MPTCP_LEN_PRIO_V1;
	opt[2] = (MPTCP_SUB_PRIO << 4) | (__u8)want;
	opt[3] = TCPOPT_NOP;
	if (bpf_skb_change_tail(skb, pkt->len + sizeof(opt), 0))
		return 0;
	if (bpf_skb_store_bytes(skb, l4 + hdr_len, opt, sizeof(opt), 0))
		return 0;
	/* The checksum: the option's bytes, the data offset, the length in
	 * the pseudo-header. */
	diff = bpf_csum_diff(NULL, 0, (__be32 *)opt, sizeof(opt), 0);
	if (diff < 0 || bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, 0, (__u32)diff, 0))
		return 0;
	__builtin_memcpy(&old_w, w, sizeof(old_w));
	w[0] = (__u8)((doff + 1) << 4) | (w[0] & 0x0f);
	__builtin_memcpy(&new_w, w, sizeof(new_w));
	if (bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, old_w, new_w, sizeof(new_w)) ||
	    bpf_skb_store_bytes(skb, l4 + TCP_DOFF_WORD, w, sizeof(w), 0))
		return 0;
	if (bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, bpf_htons(tcp_len), bpf_htons(tcp_len + sizeof(opt)),
				BPF_F_PSEUDO_HDR | sizeof(__be16)))
		return 0;
	/* The IP length: IPv4's total length (and its header checksum), or
	 * IPv6's payload length (extension headers included). */
	if (pkt->family == AF_INET) {
		if (bpf_skb_load_bytes(skb, l3 + IPV4_TOT_LEN_OFF, &old_len, sizeof(old_len)))
			return 0;
		new_len = bpf_htons(bpf_ntohs(old_len) + sizeof(opt));
		if (bpf_l3_csum_replace(skb, l3 + IPV4_CSUM_OFF, old_len, new_len, sizeof(new_len)) ||
		    bpf_skb_store_bytes(skb, l3 + IPV4_TOT_LEN_OFF, &new_len, sizeof(new_len), 0))
			return 0;
	} else {
		if (bpf_skb_load_bytes(skb, l3 + IPV6_PLEN_OFF, &old_len, sizeof(old_len)))
			return 0;
		new_len = bpf_htons(bpf_ntohs(old_len) + sizeof(opt));
		if (bpf_skb_store_bytes(skb, l3 + IPV6_PLEN_OFF, &new_len, sizeof(new_len), 0))
			return 0;
	}
	if (want)
		__sync_fetch_and_or(&sf->flags, SUBFLOW_BACKUP | SUBFLOW_BACKUP_BY_US);
	else
		__sync_fetch_and_and(&sf->flags, ~(SUBFLOW_BACKUP | SUBFLOW_BACKUP_BY_US));
	count(STAT_BACKUP_PRIO_SENT);
	return 0;
}

/* block_add_addr turns an ADD_ADDR going into the pod into NOPs when the
 * subflow's rule allows its connections no join (max_subflows 1): the
 * announcement would only make the pod open joins the policy refuses. The
 * option block keeps its length (every byte of the option becomes a NOP, 1),
 * so nothing else moves; the checksum follows from the difference over the
 * whole option block, which starts 4-byte aligned in the TCP header. Only
 * with the header-rewriting opt-in. A global function: verified once. */
__noinline int block_add_addr(struct __sk_buff *skb, const struct packet *pkt, const struct subflow *sf)
{
	__u8 old[TCP_MAX_OPTIONS_LEN], new[TCP_MAX_OPTIONS_LEN], w[2];
	__u32 rule_id, l4, optlen, start, len;
	struct rule *r;
	__s64 diff;

	if (!skb || !pkt || !sf || !has_mptcp(pkt, MPTCP_SUB_ADD_ADDR))
		return 0;
	rule_id = sf->rule;
	r = bpf_map_lookup_elem(&rules, &rule_id);
	if (!r || !(r->flags & RULE_REWRITE_HEADERS) || r->max_subflows != 1 || !ip_len_matches(skb, pkt))
		return 0;
	l4 = pkt->l4_off;
	if (bpf_skb_load_bytes(skb, l4 + TCP_DOFF_WORD, w, sizeof(w)))
		return 0;
	optlen = (__u32)(w[0] >> 4) * 4;
	if (optlen <= 20 || optlen > TCP_HDR_MAX)
		return 0;
	optlen -= 20;
	if (bpf_skb_load_bytes(skb, l4 + 20, old, optlen))
		return 0;
	start = pkt->mptcp.off[MPTCP_SUB_ADD_ADDR] - 20; /* within the option block */
	if (start >= TCP_MAX_OPTIONS_LEN - 1)
		return 0;
	/* The index from the checked register: clang would recompute it from
	 * the unchecked offset, which verifiers before 6.13 do not link. */
	asm volatile("" : "+r"(start));
	len = old[start + 1];
	if (observe_only()) {
		count(STAT_OBSERVED);
		return 0;
	}
	__builtin_memcpy(new, old, sizeof(new));
	for (__u32 i = 0; i < TCP_MAX_OPTIONS_LEN; i++) {
		if (i >= start && i < start + len)
			new[i] = TCPOPT_NOP;
	}
	diff = bpf_csum_diff((__be32 *)old, optlen, (__be32 *)new, optlen, 0);
	if (diff < 0 || bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, 0, (__u32)diff, 0))
		return 0;
	if (bpf_skb_store_bytes(skb, l4 + 20, new, optlen, 0))
		return 0;
	count(STAT_ADD_ADDR_BLOCKED);
	return 0;
}
