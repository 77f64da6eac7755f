/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The backup actor. The MP_JOIN B bit changes only what the receiver of the
 * packet believes: it steers the receiver's sending. So each node protects
 * its own pods' sending by rewriting joins going into its pods (DESIGN.md,
 * "Datapath"): the SYN-ACK answering a join the pod opened, and the SYN of a
 * join the peer opened. Included by datapath.c after its helpers (count,
 * observe_only, rule_nactive). */
#pragma once

#include "parse.h"

#define MPTCP_JOIN_BACKUP 0x01 /* B, the low bit of MP_JOIN's subtype byte (RFC 8684 3.2) */
#define TCP_CSUM_OFF	  16

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

/* backup_act sets B on a join into the pod whose subflow is on a backup path
 * of its rule, when the admin allowed header rewriting. The option's
 * subtype byte is rewritten in the 16-bit word of the TCP header holding it,
 * and the checksum updated from that word with the kernel's helper (right
 * under checksum offload too). A global function: verified once, its own
 * stack frame. */
__noinline int backup_act(struct __sk_buff *skb, const struct packet *pkt, const struct subflow *sf)
{
	__u32 rule_id, l4, byte, word;
	__be16 old, new;
	struct rule *r;
	__u8 w[2];

	if (!skb || !pkt || !sf || !join_into_pod(pkt, sf))
		return 0;
	rule_id = sf->rule;
	r = bpf_map_lookup_elem(&rules, &rule_id);
	if (!r || !(r->flags & RULE_REWRITE_HEADERS) || !backup_path(r, sf->path))
		return 0;
	l4 = pkt->l4_off;
	byte = pkt->mptcp_off[MPTCP_SUB_JOIN] + 2; /* from the TCP header */
	word = byte & ~1U;
	if (bpf_skb_load_bytes(skb, l4 + word, w, sizeof(w)))
		return 0;
	__builtin_memcpy(&old, w, sizeof(old));
	/* A branch, not an index: the verifier refuses pointer arithmetic with
	 * an OR. */
	if (byte & 1)
		w[1] |= MPTCP_JOIN_BACKUP;
	else
		w[0] |= MPTCP_JOIN_BACKUP;
	__builtin_memcpy(&new, w, sizeof(new));
	if (new == old)
		return 0; /* the sender asked for backup itself */
	if (observe_only()) {
		count(STAT_OBSERVED);
		return 0;
	}
	if (bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, old, new, sizeof(new)))
		return 0;
	if (bpf_skb_store_bytes(skb, l4 + word, w, sizeof(w), 0))
		return 0;
	count(STAT_BACKUP_FLAGGED);
	return 0;
}
