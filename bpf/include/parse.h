/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing: Ethernet (with up to two VLAN tags), IPv4 with options,
 * IPv6 with a bounded chain of extension headers, TCP and its option list.
 * Every load goes through bpf_skb_load_bytes, so non-linear skbs and short
 * packets are handled the same way: a failed load means "malformed", and the
 * caller passes the packet on untouched. */
#pragma once

#include "common.h"

#define ETH_HLEN	     14
#define ETH_P_IP	     0x0800
#define ETH_P_IPV6	     0x86DD
#define ETH_P_8021Q	     0x8100
#define ETH_P_8021AD	     0x88A8
#define IPPROTO_TCP	     6
#define MAX_VLAN_TAGS	     2
#define MAX_IPV6_EXT_HEADERS 4
#define TCP_MAX_OPTIONS_LEN  40

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

#define TCPOPT_EOL   0
#define TCPOPT_NOP   1
#define TCPOPT_MPTCP 30

/* MPTCP option subtypes, RFC 8684 section 3 (IANA "MPTCP Option Subtypes"). */
#define MPTCP_SUB_CAPABLE     0
#define MPTCP_SUB_JOIN	      1
#define MPTCP_SUB_DSS	      2
#define MPTCP_SUB_ADD_ADDR    3
#define MPTCP_SUB_REMOVE_ADDR 4
#define MPTCP_SUB_PRIO	      5
#define MPTCP_SUB_FAIL	      6
#define MPTCP_SUB_FASTCLOSE   7
#define MPTCP_SUB_TCPRST      8
#define MPTCP_SUB_NONE	      0xff

enum parse_result {
	PARSE_OK = 0,
	PARSE_NOT_TCP = 1, /* not IP, not TCP, or a non-first fragment */
	PARSE_MALFORMED = 2,
};

struct packet {
	__u8 family;
	__u8 tcp_flags;
	__u8 mptcp_subtype; /* first MPTCP option's subtype, MPTCP_SUB_NONE if none */
	__u8 mptcp_len;	    /* its length field */
	__u16 l4_off;	    /* offset of the TCP header from the start of the frame */
	__u16 mptcp_off;    /* offset of the first MPTCP option from the start of the frame */
	__u32 len;	    /* skb->len */
	__be16 sport;
	__be16 dport;
	__u8 saddr[16];
	__u8 daddr[16];
};

struct vlan_tag {
	__be16 tci;
	__be16 encap_proto;
};

struct ipv4_hdr {
	__u8 ver_ihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__sum16 check;
	__be32 saddr;
	__be32 daddr;
};

struct ipv6_hdr {
	__be32 ver_tc_flow;
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u8 saddr[16];
	__u8 daddr[16];
};

struct ipv6_ext {
	__u8 nexthdr;
	__u8 hdrlen;
	__be16 frag_off; /* only meaningful for the fragment header */
};

struct tcp_hdr {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u8 doff_res; /* data offset in the high 4 bits */
	__u8 flags;
	__be16 window;
	__sum16 check;
	__be16 urg_ptr;
};

#define IP_MF		 0x2000
#define IP_OFFSET	 0x1FFF
#define NEXTHDR_HOP	 0
#define NEXTHDR_ROUTING	 43
#define NEXTHDR_FRAGMENT 44
#define NEXTHDR_AUTH	 51
#define NEXTHDR_DEST	 60

static __always_inline int parse_l3(struct __sk_buff *skb, struct packet *pkt, __u32 *off, __u8 *proto)
{
	__be16 h_proto;
	__u32 o = 12;

	if (bpf_skb_load_bytes(skb, o, &h_proto, sizeof(h_proto)))
		return PARSE_MALFORMED;
	o = ETH_HLEN;

#pragma unroll
	for (int i = 0; i < MAX_VLAN_TAGS; i++) {
		struct vlan_tag tag;

		if (h_proto != bpf_htons(ETH_P_8021Q) && h_proto != bpf_htons(ETH_P_8021AD))
			break;
		if (bpf_skb_load_bytes(skb, o, &tag, sizeof(tag)))
			return PARSE_MALFORMED;
		h_proto = tag.encap_proto;
		o += sizeof(tag);
	}

	if (h_proto == bpf_htons(ETH_P_IP)) {
		struct ipv4_hdr ip;
		__u32 ihl;

		if (bpf_skb_load_bytes(skb, o, &ip, sizeof(ip)))
			return PARSE_MALFORMED;
		ihl = (ip.ver_ihl & 0x0f) * 4;
		if ((ip.ver_ihl >> 4) != 4 || ihl < sizeof(ip))
			return PARSE_MALFORMED;
		/* Only first fragments carry the TCP header, and a fragmented
		 * SYN is not worth steering: leave all fragments alone. */
		if (ip.frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return PARSE_NOT_TCP;
		pkt->family = AF_INET;
		__builtin_memcpy(pkt->saddr, &ip.saddr, 4);
		__builtin_memcpy(pkt->daddr, &ip.daddr, 4);
		*proto = ip.protocol;
		*off = o + ihl;
		return PARSE_OK;
	}

	if (h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6_hdr ip6;
		__u8 next;

		if (bpf_skb_load_bytes(skb, o, &ip6, sizeof(ip6)))
			return PARSE_MALFORMED;
		if ((bpf_ntohl(ip6.ver_tc_flow) >> 28) != 6)
			return PARSE_MALFORMED;
		pkt->family = AF_INET6;
		__builtin_memcpy(pkt->saddr, ip6.saddr, 16);
		__builtin_memcpy(pkt->daddr, ip6.daddr, 16);
		next = ip6.nexthdr;
		o += sizeof(ip6);

#pragma unroll
		for (int i = 0; i < MAX_IPV6_EXT_HEADERS; i++) {
			struct ipv6_ext ext;

			if (next != NEXTHDR_HOP && next != NEXTHDR_ROUTING && next != NEXTHDR_DEST &&
			    next != NEXTHDR_FRAGMENT && next != NEXTHDR_AUTH)
				break;
			if (bpf_skb_load_bytes(skb, o, &ext, sizeof(ext)))
				return PARSE_MALFORMED;
			if (next == NEXTHDR_FRAGMENT) {
				/* Offset (13 bits) and M flag: any fragment is skipped. */
				if (ext.frag_off & bpf_htons(0xfff9))
					return PARSE_NOT_TCP;
				o += 8;
			} else if (next == NEXTHDR_AUTH) {
				o += ((__u32)ext.hdrlen + 2) * 4;
			} else {
				o += ((__u32)ext.hdrlen + 1) * 8;
			}
			next = ext.nexthdr;
		}
		*proto = next;
		*off = o;
		return PARSE_OK;
	}

	return PARSE_NOT_TCP;
}

struct option_scan {
	__u8 opts[TCP_MAX_OPTIONS_LEN];
	__u32 optlen;
	__u32 pos;
	__u32 mptcp_pos; /* offset of the first MPTCP option within opts */
	__u8 mptcp_len;
	__u8 mptcp_subtype;
	__u8 malformed;
	__u8 pad;
};

/* scan_option is one step of the option walk, run under bpf_loop so the
 * verifier checks the step once instead of every path through 40 unrolled
 * iterations. Returns 1 to stop. */
static long scan_option(__u32 index, void *ctx)
{
	struct option_scan *s = ctx;
	__u32 pos = s->pos;
	__u8 kind, len;

	if (pos >= s->optlen || pos >= TCP_MAX_OPTIONS_LEN - 1)
		return 1;
	kind = s->opts[pos];
	if (kind == TCPOPT_EOL)
		return 1;
	if (kind == TCPOPT_NOP) {
		s->pos = pos + 1;
		return 0;
	}
	len = s->opts[pos + 1];
	if (len < 2 || pos + len > s->optlen) {
		s->malformed = 1;
		return 1;
	}
	if (kind == TCPOPT_MPTCP && s->mptcp_subtype == MPTCP_SUB_NONE) {
		if (len < 3 || pos + 2 >= TCP_MAX_OPTIONS_LEN) {
			s->malformed = 1;
			return 1;
		}
		s->mptcp_subtype = s->opts[pos + 2] >> 4;
		s->mptcp_len = len;
		s->mptcp_pos = pos;
	}
	s->pos = pos + len;
	return 0;
}

/* parse_packet fills pkt for a TCP packet and finds its first MPTCP option.
 * It never writes to the packet. */
static __always_inline int parse_packet(struct __sk_buff *skb, struct packet *pkt)
{
	struct option_scan scan = {.mptcp_subtype = MPTCP_SUB_NONE};
	struct tcp_hdr tcp;
	__u32 off = 0, optlen;
	__u8 proto = 0;
	int ret;

	pkt->len = skb->len;
	pkt->mptcp_subtype = MPTCP_SUB_NONE;
	ret = parse_l3(skb, pkt, &off, &proto);
	if (ret != PARSE_OK)
		return ret;
	if (proto != IPPROTO_TCP)
		return PARSE_NOT_TCP;
	if (off > 0xffff - TCP_MAX_OPTIONS_LEN - sizeof(tcp))
		return PARSE_MALFORMED;
	if (bpf_skb_load_bytes(skb, off, &tcp, sizeof(tcp)))
		return PARSE_MALFORMED;

	pkt->l4_off = off;
	pkt->sport = tcp.source;
	pkt->dport = tcp.dest;
	pkt->tcp_flags = tcp.flags;

	optlen = (tcp.doff_res >> 4) * 4;
	if (optlen < sizeof(tcp))
		return PARSE_MALFORMED;
	optlen -= sizeof(tcp);
	if (optlen == 0)
		return PARSE_OK;
	if (optlen > TCP_MAX_OPTIONS_LEN)
		return PARSE_MALFORMED;
	if (bpf_skb_load_bytes(skb, off + sizeof(tcp), scan.opts, optlen))
		return PARSE_MALFORMED;
	scan.optlen = optlen;

	/* Each step consumes at least one byte, so 40 steps cover the whole
	 * option space. */
	bpf_loop(TCP_MAX_OPTIONS_LEN, scan_option, &scan, 0);
	if (scan.malformed)
		return PARSE_MALFORMED;
	if (scan.mptcp_subtype != MPTCP_SUB_NONE) {
		pkt->mptcp_subtype = scan.mptcp_subtype;
		pkt->mptcp_len = scan.mptcp_len;
		pkt->mptcp_off = off + sizeof(tcp) + scan.mptcp_pos;
	}
	return PARSE_OK;
}
