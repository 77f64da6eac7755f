/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The block actor's join reset. A join the rule does not allow is answered
 * at once with a TCP reset carrying MP_TCPRST "administratively prohibited"
 * (RFC 8684 3.6): a silently dropped SYN would be retried for minutes. The
 * join's SYN becomes the reset in place and goes back out of the NIC it came
 * in on. Included by datapath.c after its helpers and backup.h. */
#pragma once

#include "parse.h"

#define MPTCP_RST_EPROHIBIT 0x03 /* MP_TCPRST reason: administratively prohibited */
#define MPTCP_LEN_TCPRST_V1 4
#define RST_TCP_LEN	    24 /* TCP header and MP_TCPRST */
#define TCP_FLAGS_RST_ACK   0x14
#define RST_TTL		    64

struct rst_tcp {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u8 doff_res;
	__u8 flags;
	__be16 window;
	__be16 check;
	__be16 urg_ptr;
	__u8 opt[MPTCP_LEN_TCPRST_V1];
};

struct pseudo4 {
	__be32 saddr;
	__be32 daddr;
	__u8 zero;
	__u8 proto;
	__be16 len;
};

struct pseudo6 {
	__u8 saddr[16];
	__u8 daddr[16];
	__be32 len;
	__u8 zero[3];
	__u8 next;
};

/* join_refused says whether rule rule_id refuses a peer's join arriving on
 * path: the path is one of its blocked paths, or the join would take its
 * connection c (NULL: not known) past the rule's maximum. */
static __always_inline bool join_refused(__u32 rule_id, const struct conn *c, __u32 path)
{
	struct rule *r = bpf_map_lookup_elem(&rules, &rule_id);

	if (!r)
		return false;
	if (r->blocked & (1U << (path & MAX_PATHS)))
		return true;
	return conn_full(r, c);
}

static __always_inline __u16 csum_fold32(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* What build_reset and refuse_join return when a helper failed after the
 * packet was changed: it is neither the SYN nor the reset any more. */
#define REFUSE_BROKEN (-2)

/* build_reset writes the reset over the join SYN whose TCP header is at l4,
 * right behind a bare IP header at l3. Returns 0, -1 when a helper failed
 * before anything was changed, or REFUSE_BROKEN. */
static __always_inline int build_reset(struct __sk_buff *skb, const struct packet *pkt, __u32 l3, __u32 l4,
				       __u32 seq)
{
	struct rst_tcp t = {};
	__u8 macs[12], swapped[12];
	__s64 sum;

	t.source = pkt->dport;
	t.dest = pkt->sport;
	t.ack_seq = bpf_htonl(seq + 1);
	t.doff_res = (RST_TCP_LEN / 4) << 4;
	t.flags = TCP_FLAGS_RST_ACK;
	t.opt[0] = TCPOPT_MPTCP;
	t.opt[1] = MPTCP_LEN_TCPRST_V1;
	t.opt[2] = MPTCP_SUB_TCPRST << 4;
	t.opt[3] = MPTCP_RST_EPROHIBIT;

	if (pkt->family == AF_INET) {
		struct pseudo4 ph = {.proto = IPPROTO_TCP, .len = bpf_htons(RST_TCP_LEN)};
		struct ipv4_hdr ip;

		if (bpf_skb_load_bytes(skb, l3, &ip, sizeof(ip)))
			return -1;
		__builtin_memcpy(&ph.saddr, pkt->daddr, 4);
		__builtin_memcpy(&ph.daddr, pkt->saddr, 4);
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
		if (sum < 0)
			return -1;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&t, sizeof(t), (__u32)sum);
		if (sum < 0)
			return -1;
		t.check = csum_fold32((__u64)sum);
		ip.ver_ihl = 0x45; /* version 4, no options */
		ip.saddr = ph.saddr;
		ip.daddr = ph.daddr;
		ip.tot_len = bpf_htons(20 + RST_TCP_LEN);
		ip.ttl = RST_TTL;
		ip.check = 0;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&ip, sizeof(ip), 0);
		if (sum < 0)
			return -1;
		ip.check = csum_fold32((__u64)sum);
		if (bpf_skb_change_tail(skb, l4 + RST_TCP_LEN, 0) ||
		    bpf_skb_store_bytes(skb, l3, &ip, sizeof(ip), 0))
			return REFUSE_BROKEN;
	} else {
		struct pseudo6 ph = {.len = bpf_htonl(RST_TCP_LEN), .next = IPPROTO_TCP};
		struct ipv6_hdr ip6;

		if (bpf_skb_load_bytes(skb, l3, &ip6, sizeof(ip6)))
			return -1;
		__builtin_memcpy(ph.saddr, pkt->daddr, 16);
		__builtin_memcpy(ph.daddr, pkt->saddr, 16);
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
		if (sum < 0)
			return -1;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&t, sizeof(t), (__u32)sum);
		if (sum < 0)
			return -1;
		t.check = csum_fold32((__u64)sum);
		__builtin_memcpy(ip6.saddr, ph.saddr, 16);
		__builtin_memcpy(ip6.daddr, ph.daddr, 16);
		ip6.nexthdr = IPPROTO_TCP; /* no extension header */
		ip6.payload_len = bpf_htons(RST_TCP_LEN);
		ip6.hop_limit = RST_TTL;
		if (bpf_skb_change_tail(skb, l4 + RST_TCP_LEN, 0) ||
		    bpf_skb_store_bytes(skb, l3, &ip6, sizeof(ip6), 0))
			return REFUSE_BROKEN;
	}
	if (bpf_skb_store_bytes(skb, l4, &t, sizeof(t), 0))
		return REFUSE_BROKEN;
	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)))
		return REFUSE_BROKEN;
	__builtin_memcpy(swapped, macs + 6, 6);
	__builtin_memcpy(swapped + 6, macs, 6);
	if (bpf_skb_store_bytes(skb, 0, swapped, sizeof(swapped), 0))
		return REFUSE_BROKEN;
	bpf_csum_level(skb, BPF_CSUM_LEVEL_RESET);
	return 0;
}

/* refuse_join turns the join SYN in skb into the reset that refuses it:
 * addresses, ports and MACs swapped, SEQ 0 and ACK the SYN's sequence + 1 (RFC
 * 9293 3.10.7.1: the answer to a segment without ACK), RST|ACK, MP_TCPRST with
 * the reason, nothing else; the IP length, TTL and both checksums computed
 * anew, and the skb's checksum state reset so nothing downstream trusts a
 * stale one. The reset carries a bare IP header: IPv4 options and IPv6
 * extension headers of the SYN (a route, a hop-by-hop option meant for the
 * SYN's path) do not belong on the answer, so they are cut out first. That
 * needs the kernel to know the frame's IP header (bpf_skb_adjust_room): a
 * frame with options behind a VLAN tag in the payload, or one the kernel will
 * not shrink, returns -1 and the join is let through (and counted as any
 * join). A helper failing once the packet was changed (the cut, or the
 * reset's first write) returns REFUSE_BROKEN: the packet is neither the SYN
 * nor the reset any more, and is dropped. A global function: verified once. */
__noinline int refuse_join(struct __sk_buff *skb, const struct packet *pkt)
{
	__u32 l3, l4, seq, base;
	bool cut = false;
	__be32 raw_seq;
	int ret;

	if (!skb || !pkt)
		return -1;
	l3 = pkt->l3_off;
	l4 = pkt->l4_off;
	base = pkt->family == AF_INET ? 20 : 40;
	if (l4 < l3 + base || l4 - l3 > 0xffff)
		return -1;
	if (bpf_skb_load_bytes(skb, l4 + 4, &raw_seq, sizeof(raw_seq)))
		return -1;
	seq = bpf_ntohl(raw_seq);
	if (l4 != l3 + base) {
		/* Removes what lies between the fixed IP header and TCP. */
		if (bpf_skb_adjust_room(skb, -(__s32)(l4 - l3 - base), BPF_ADJ_ROOM_NET, 0))
			return -1;
		l4 = l3 + base;
		cut = true;
	}
	ret = build_reset(skb, pkt, l3, l4, seq);
	/* After a cut the SYN's IP header no longer describes it: it must
	 * not go on either. */
	if (ret && cut)
		return REFUSE_BROKEN;
	return ret;
}

/* answer_refused_join sends the reset that refuses the join in skb back
 * towards its sender and returns that verdict: out of the interface it came
 * in on (redirect 0: a peer's join at its NIC; the pod's own at its veth,
 * into the pod), or, from a pod's veth on its way into the pod
 * (BPF_F_INGRESS), into the node as if the pod had sent it: the frame's MACs
 * are then the veth's and the pod's, which swapped are right for a frame
 * from the pod, and the node routes the reset to the peer as it routes the
 * pod's own packets. It returns TCX_NEXT, and the caller lets the join pass,
 * in observe-only mode or when the reset cannot be built (see refuse_join);
 * TC_ACT_SHOT when the packet was cut and could not be finished. */
static __always_inline int answer_refused_join(struct __sk_buff *skb, const struct packet *pkt,
					       __u64 redirect)
{
	int ret;

	if (observe_only()) {
		count(STAT_OBSERVED);
		return TCX_NEXT;
	}
	ret = refuse_join(skb, pkt);
	if (ret == REFUSE_BROKEN) {
		/* Refused all the same, without the answer: the peer's SYN
		 * retransmission gets it. */
		count(STAT_JOIN_REFUSED);
		return TC_ACT_SHOT;
	}
	if (ret)
		return TCX_NEXT;
	count(STAT_JOIN_REFUSED);
	return bpf_redirect(skb->ifindex, redirect);
}
