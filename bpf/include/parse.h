/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing: Ethernet (with up to two VLAN tags), IPv4 with options,
 * IPv6 with a bounded chain of extension headers, TCP and its option list.
 * Headers are read in place when they lie in the skb's linear data (direct
 * packet access, no helper call), and copied out with bpf_skb_load_bytes
 * otherwise, so non-linear skbs and short packets are handled the same way:
 * a header that cannot be read means "malformed", and the caller passes the
 * packet on untouched (the kernel drops it: it cannot read it either). A
 * broken TCP option list is not malformed: it is read as the kernel reads it
 * (see OPTS_END_EOL). */
#pragma once

#include "common.h"

#define ETH_HLEN	     14
#define ETH_P_IP	     0x0800
#define ETH_P_IPV6	     0x86DD
#define ETH_P_8021Q	     0x8100
#define ETH_P_8021AD	     0x88A8
#define IPPROTO_TCP	     6
#define IPPROTO_UDP	     17
#define MAX_VLAN_TAGS	     2
#define MAX_IPV6_EXT_HEADERS 4
#define TCP_MAX_OPTIONS_LEN  40
#define TCP_HDR_LEN	     20 /* without options */

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

#define TCPOPT_EOL     0
#define TCPOPT_NOP     1
#define TCPOPT_WSCALE  3 /* window scale, RFC 7323 2.2 */
#define TCPOLEN_WSCALE 3
#define TCP_WSCALE_MAX 14 /* a larger shift is taken as 14, RFC 7323 2.3 */
#define TCPOPT_MPTCP   30

/* MPTCP option subtypes, RFC 8684 section 3 (IANA "MPTCP Option Subtypes").
 * The subtype is the high nibble of the option's third byte, so there are
 * 16 possible values; 0x9..0xe are unassigned and 0xf is MP_EXPERIMENTAL.
 * The wire's numbers, and the index of the pinned mptcp_options counters:
 * append-only (enum stat_id, common.h). */
enum mptcp_subtype {
	MPTCP_SUB_CAPABLE = 0x0,
	MPTCP_SUB_JOIN = 0x1,
	MPTCP_SUB_DSS = 0x2,
	MPTCP_SUB_ADD_ADDR = 0x3,
	MPTCP_SUB_REMOVE_ADDR = 0x4,
	MPTCP_SUB_PRIO = 0x5,
	MPTCP_SUB_FAIL = 0x6,
	MPTCP_SUB_FASTCLOSE = 0x7,
	MPTCP_SUB_TCPRST = 0x8,
	MPTCP_SUB_EXPERIMENTAL = 0xf,
};
#define MPTCP_SUBTYPES 16
#define MPTCP_SUB_NONE 0xff

/* Option lengths per subtype (RFC 8684 section 3). Kind, length and the
 * subtype byte are common to all: an MPTCP option has at least 3 bytes. */
#define MPTCP_LEN_MIN			3
#define MPTCP_LEN_CAPABLE_SYN		4  /* 3.1: v1 SYN, no key */
#define MPTCP_LEN_CAPABLE_KEY		12 /* 3.1: SYN-ACK (or a v0 SYN), one key */
#define MPTCP_LEN_CAPABLE_ACK		20 /* 3.1: third ACK, both keys */
#define MPTCP_LEN_CAPABLE_ACK_DATA	22 /* 3.1: with data-level length */
#define MPTCP_LEN_CAPABLE_ACK_DATA_CSUM 24 /* 3.1: and checksum */
#define MPTCP_LEN_JOIN_SYN		12 /* 3.2: token and nonce */
#define MPTCP_LEN_JOIN_SYNACK		16 /* 3.2: truncated HMAC and nonce */
#define MPTCP_LEN_JOIN_ACK		24 /* 3.2: full HMAC */
#define MPTCP_LEN_DSS_BASE		4  /* 3.3: kind, length, subtype, flags */
#define MPTCP_LEN_ADD_ADDR_BASE		4  /* 3.4.1: kind, length, subtype|E, address id */
#define MPTCP_LEN_ADD_ADDR_V4		4
#define MPTCP_LEN_ADD_ADDR_V6		16
#define MPTCP_LEN_ADD_ADDR_PORT		2
#define MPTCP_LEN_ADD_ADDR_HMAC		8  /* absent when E (echo) is set */
#define MPTCP_LEN_REMOVE_ADDR_MIN	4  /* 3.4.2: at least one address id */
#define MPTCP_LEN_PRIO			3  /* 3.3.8: v1 form */
#define MPTCP_LEN_PRIO_V0		4  /* RFC 6824 form with an address id */
#define MPTCP_LEN_FAIL			12 /* 3.7: 64-bit DSN */
#define MPTCP_LEN_FASTCLOSE		12 /* 3.5: receiver's key */
#define MPTCP_LEN_TCPRST		4  /* 3.6: flags and reason */

/* DSS flags, the fourth byte (RFC 8684 section 3.3, figure 9). */
#define MPTCP_DSS_DATA_ACK     0x01 /* A: Data ACK present */
#define MPTCP_DSS_DATA_ACK8    0x02 /* a: Data ACK is 8 octets */
#define MPTCP_DSS_MAPPING      0x04 /* M: DSN, SSN, data-level length (and checksum) present */
#define MPTCP_DSS_DSN8	       0x08 /* m: DSN is 8 octets */
#define MPTCP_DSS_DATA_FIN     0x10 /* F: DATA_FIN */
#define MPTCP_DSS_MAPPING_LEN  6    /* SSN (4) and data-level length (2) */
#define MPTCP_DSS_CHECKSUM_LEN 2
#define MPTCP_ADD_ADDR_ECHO    0x01 /* E, low bit of the subtype byte (3.4.1) */

/* What parse_packet made of a packet: a return value, never stored. */
enum parse_result {
	PARSE_OK = 0,
	PARSE_NOT_TCP = 1, /* not IP, not TCP, or a fragment of something else */
	PARSE_MALFORMED = 2,
	/* Internal to this file: the inline read of the common headers
	 * declines, the full parser decides. Never returned by parse_packet. */
	PARSE_SLOW = 3,
	/* A fragment of a TCP segment (IPv6: of a packet whose fragmentable
	 * part starts with TCP or an extension header): its addresses are
	 * read, its options cannot be, and the receiving kernel reassembles
	 * and obeys them. */
	PARSE_UNREADABLE_TCP = 4,
	/* An IPv6 packet with more extension headers than the parser reads:
	 * its addresses are read; what it carries, TCP or UDP, is not. */
	PARSE_UNREADABLE = 5,
};

/* The MPTCP options of a segment as the receiving kernel reads them, located
 * by subtype: a packet may carry several (e.g. DSS with ADD_ADDR, or MP_PRIO
 * on a DSS ACK), and every option the kernel reads is considered. Only the
 * first valid occurrence of each subtype is located (but the last MP_PRIO,
 * which Linux obeys); actors read its fields at l4_off + off[subtype]. Its
 * length is not kept: it was checked against the subtype and the segment
 * (mptcp_option_valid), and is one load away. A segment on which the first
 * occurrence may not be the one the kernel obeys is OPTS_AMBIGUOUS. */
struct mptcp_found {
	__u16 seen;    /* bit s: a valid option of subtype s is present */
	__u16 invalid; /* bit s: an option of subtype s had a length RFC 8684 does not define */
	/* Per subtype: offset of the option from the start of the TCP header
	 * (0: absent, options start at 20). */
	__u8 off[MPTCP_SUBTYPES];
	__u8 flags; /* OPTS_* */
};

/* How Linux reads a TCP option list (tcp_parse_options; for MPTCP,
 * mptcp_get_options, which hands each MPTCP option to mptcp_parse_option):
 * in order, up to an EOL, or up to an option whose length is below 2, runs
 * past the header or is missing; it acts on the options before that point
 * and ignores the rest, and so does the parser. An MPTCP option of length 2
 * has no subtype byte: the kernel takes the byte after it for one (every
 * subtype refuses that length, though DSS and ADD_ADDR write some of their
 * fields before they look at it) and reads on. mptcp_parse_option writes
 * what it reads into one struct per segment, so a later MPTCP option of a
 * subtype overwrites what an earlier one wrote: the kernel obeys the last
 * MP_CAPABLE, MP_JOIN, DSS or ADD_ADDR of a segment, and MP_JOIN (of SYN or
 * SYN-ACK length) and MP_PRIO write the same one B.
 * TestTheKernelReadsJoinOptionsAsTheParserDoes (internal/datapath) shows
 * this on the running kernel for join SYNs: the MP_JOIN before a break is
 * read, none after it; the walk goes on after an MPTCP option of length 2;
 * B comes from the last MP_JOIN or MP_PRIO, the token from the last MP_JOIN.
 *
 * struct mptcp_found's flags. OPTS_END_EOL and OPTS_END_BROKEN: the kernel
 * stops reading before the end of the header (an EOL; a broken option), so
 * an option added at the tail would go unread. OPTS_AMBIGUOUS: the kernel
 * could read the segment's MPTCP options otherwise than the datapath (an
 * MPTCP option of length 2; MP_CAPABLE, MP_JOIN, DSS, ADD_ADDR or MP_PRIO
 * more than once, whatever the lengths; MP_JOIN with MP_CAPABLE; an MP_JOIN
 * of SYN or SYN-ACK length, which carries a B, with MP_PRIO). No MPTCP stack
 * sends such a segment, and a kernel that ignores repeated or conflicting
 * suboptions obeys the first where an older one obeys the last: the
 * programs drop it to and from selected pods rather than depend on which
 * (docs/datapath.md, "Parsing"). The join's third ACK (its full HMAC, no B)
 * with an MP_PRIO is not ambiguous: Linux sends that pair when a path
 * manager changes a join's role before the join is fully established. */
#define OPTS_END_EOL	0x01
#define OPTS_END_BROKEN 0x02
#define OPTS_AMBIGUOUS	0x04

/* The subtypes an actor reads or rewrites, and which a segment therefore
 * must not repeat. */
#define MPTCP_SUBTYPES_READ                                                                                  \
	((1U << MPTCP_SUB_CAPABLE) | (1U << MPTCP_SUB_JOIN) | (1U << MPTCP_SUB_DSS) |                        \
	 (1U << MPTCP_SUB_ADD_ADDR) | (1U << MPTCP_SUB_PRIO))

/* What the parser found. Addresses come first and the struct is 8-byte
 * aligned, so that they are compared and copied a word at a time. */
struct packet {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u32 len;    /* skb->len */
	__u16 l3_off; /* offset of the IP header from the start of the frame */
	__u16 l4_off; /* offset of the TCP header from the start of the frame */
	__u8 family;  /* AF_INET or AF_INET6 */
	__u8 tcp_flags;
	__u8 tcp_hlen; /* the TCP header's length, options included */
	/* The window-scale option's shift + 1 (at most TCP_WSCALE_MAX + 1),
	 * 0 without one. Only SYNs may carry it, and a SYN's options are
	 * never the common layout, so the walk finds it. */
	__u8 wscale;
	struct mptcp_found mptcp;
} __attribute__((aligned(8)));

static __always_inline bool has_mptcp(const struct packet *pkt, __u32 subtype)
{
	return pkt->mptcp.seen & (1U << subtype);
}

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

/* MAX_HDR_OFF bounds a header's offset so that the verifier accepts
 * data + off (it refuses packet offsets it cannot bound below 64 KiB). */
#define MAX_HDR_OFF 0x7fff

/* header_at returns len bytes at off: a pointer into the packet when they
 * are in the linear data, else buf filled by bpf_skb_load_bytes; NULL when
 * the packet is shorter. The pointer is valid until the packet is changed. */
static __always_inline const void *header_at(struct __sk_buff *skb, __u32 off, __u32 len, void *buf)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	void *p;

	if (off <= MAX_HDR_OFF) {
		p = data + off;
		/* Keep "p + len" derived from p, so that the check below gives
		 * p its range. */
		asm volatile("" : "+r"(p));
		if (p + len <= data_end)
			return p;
	}
	if (bpf_skb_load_bytes(skb, off, buf, len))
		return NULL;
	return buf;
}

#define IP_MF		 0x2000
#define IP_OFFSET	 0x1FFF
#define NEXTHDR_HOP	 0
#define NEXTHDR_ROUTING	 43
#define NEXTHDR_FRAGMENT 44
#define NEXTHDR_AUTH	 51
#define NEXTHDR_DEST	 60

/* is_ipv6_ext_header says whether next is an extension header the parser
 * steps over (anything else ends the chain: TCP, or another protocol). */
static __always_inline bool is_ipv6_ext_header(__u8 next)
{
	return next == NEXTHDR_HOP || next == NEXTHDR_ROUTING || next == NEXTHDR_DEST ||
	       next == NEXTHDR_FRAGMENT || next == NEXTHDR_AUTH;
}

/* parse_l3 reads the Ethernet and IP headers: the family and addresses, and
 * where the transport header starts with which protocol. A fragment is
 * PARSE_UNREADABLE_TCP or PARSE_NOT_TCP, after its addresses are read: only
 * first fragments carry the TCP header, and none its whole option list for
 * sure; the rate actor still caps fragments by their addresses. A first
 * fragment gives its protocol and where its transport header starts, as a
 * whole packet does. */
static __always_inline int parse_l3(struct __sk_buff *skb, struct packet *pkt, __u32 *off, __u8 *proto)
{
	const __be16 *h_proto_p;
	__be16 h_proto, buf16;
	__u32 o = 12;

	h_proto_p = header_at(skb, o, sizeof(h_proto), &buf16);
	if (!h_proto_p)
		return PARSE_MALFORMED;
	h_proto = *h_proto_p;
	o = ETH_HLEN;

#pragma unroll
	for (int i = 0; i < MAX_VLAN_TAGS; i++) {
		const struct vlan_tag *tag;
		struct vlan_tag tag_buf;

		if (h_proto != bpf_htons(ETH_P_8021Q) && h_proto != bpf_htons(ETH_P_8021AD))
			break;
		tag = header_at(skb, o, sizeof(*tag), &tag_buf);
		if (!tag)
			return PARSE_MALFORMED;
		h_proto = tag->encap_proto;
		o += sizeof(*tag);
	}

	pkt->l3_off = o;
	if (h_proto == bpf_htons(ETH_P_IP)) {
		const struct ipv4_hdr *ip;
		struct ipv4_hdr ip_buf;
		__u32 ihl;

		ip = header_at(skb, o, sizeof(*ip), &ip_buf);
		if (!ip)
			return PARSE_MALFORMED;
		ihl = (ip->ver_ihl & 0x0f) * 4;
		if ((ip->ver_ihl >> 4) != 4 || ihl < sizeof(*ip))
			return PARSE_MALFORMED;
		pkt->family = AF_INET;
		__builtin_memcpy(pkt->saddr, &ip->saddr, 4);
		__builtin_memcpy(pkt->daddr, &ip->daddr, 4);
		if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)) {
			if (!(ip->frag_off & bpf_htons(IP_OFFSET))) {
				*proto = ip->protocol;
				*off = o + ihl;
			}
			return ip->protocol == IPPROTO_TCP ? PARSE_UNREADABLE_TCP : PARSE_NOT_TCP;
		}
		*proto = ip->protocol;
		*off = o + ihl;
		return PARSE_OK;
	}

	if (h_proto == bpf_htons(ETH_P_IPV6)) {
		const struct ipv6_hdr *ip6;
		struct ipv6_hdr ip6_buf;
		__u8 next;

		ip6 = header_at(skb, o, sizeof(*ip6), &ip6_buf);
		if (!ip6)
			return PARSE_MALFORMED;
		if ((bpf_ntohl(ip6->ver_tc_flow) >> 28) != 6)
			return PARSE_MALFORMED;
		pkt->family = AF_INET6;
		__builtin_memcpy(pkt->saddr, ip6->saddr, 16);
		__builtin_memcpy(pkt->daddr, ip6->daddr, 16);
		next = ip6->nexthdr;
		o += sizeof(*ip6);

#pragma unroll
		for (int i = 0; i < MAX_IPV6_EXT_HEADERS; i++) {
			const struct ipv6_ext *ext;
			struct ipv6_ext ext_buf;

			if (!is_ipv6_ext_header(next))
				break;
			ext = header_at(skb, o, sizeof(*ext), &ext_buf);
			if (!ext)
				return PARSE_MALFORMED;
			if (next == NEXTHDR_FRAGMENT) {
				/* Offset (13 bits) and M flag: a fragment. What
				 * its fragmentable part starts with is in every
				 * fragment: TCP, or an extension header that may
				 * lead to TCP. */
				if (ext->frag_off & bpf_htons(0xfff9)) {
					if (!(ext->frag_off & bpf_htons(0xfff8))) {
						*proto = ext->nexthdr;
						*off = o + 8;
					}
					return ext->nexthdr == IPPROTO_TCP || is_ipv6_ext_header(ext->nexthdr)
						   ? PARSE_UNREADABLE_TCP
						   : PARSE_NOT_TCP;
				}
				o += 8;
			} else if (next == NEXTHDR_AUTH) {
				o += ((__u32)ext->hdrlen + 2) * 4;
			} else {
				o += ((__u32)ext->hdrlen + 1) * 8;
			}
			next = ext->nexthdr;
		}
		if (is_ipv6_ext_header(next))
			return PARSE_UNREADABLE;
		*proto = next;
		*off = o;
		return PARSE_OK;
	}

	return PARSE_NOT_TCP;
}

struct option_scan {
	__u8 opts[TCP_MAX_OPTIONS_LEN];
	struct mptcp_found found;
	__u16 occurred; /* bit s: an MPTCP option of subtype s was read, whatever its length */
	__u16 repeated; /* bit s: more than one was */
	__u8 join_b;	/* an MP_JOIN of SYN or SYN-ACK length, which carries a B, was read */
	__u8 wscale;	/* as struct packet's */
	__u8 optlen;
	__u8 pos;
	__u8 tcp_flags;
};

/* dss_len is the length a DSS option with these flags has, without the
 * optional checksum (RFC 8684 section 3.3, figure 9). */
static __always_inline __u32 dss_len(__u8 flags)
{
	__u32 len = MPTCP_LEN_DSS_BASE;

	if (flags & MPTCP_DSS_DATA_ACK)
		len += (flags & MPTCP_DSS_DATA_ACK8) ? 8 : 4;
	if (flags & MPTCP_DSS_MAPPING)
		len += ((flags & MPTCP_DSS_DSN8) ? 8 : 4) + MPTCP_DSS_MAPPING_LEN;
	return len;
}

/* add_addr_valid: an IPv4 or IPv6 address, optionally a port, and a
 * truncated HMAC unless the option is the echo (E=1) of one received
 * (RFC 8684 section 3.4.1, figure 12). The address family is known only
 * from the length. */
static __always_inline bool add_addr_valid(__u32 len, __u8 sub_byte)
{
	__u32 base = MPTCP_LEN_ADD_ADDR_BASE;

	if (!(sub_byte & MPTCP_ADD_ADDR_ECHO))
		base += MPTCP_LEN_ADD_ADDR_HMAC;
	return len == base + MPTCP_LEN_ADD_ADDR_V4 ||
	       len == base + MPTCP_LEN_ADD_ADDR_V4 + MPTCP_LEN_ADD_ADDR_PORT ||
	       len == base + MPTCP_LEN_ADD_ADDR_V6 ||
	       len == base + MPTCP_LEN_ADD_ADDR_V6 + MPTCP_LEN_ADD_ADDR_PORT;
}

/* mptcp_option_valid checks an option's length against what RFC 8684 defines
 * for its subtype and, for the handshake options, for the segment that
 * carries it, as the kernel's own parser does. An option that fails is
 * ignored (the receiver ignores it too), not a reason to stop marking the
 * packet. Unassigned and experimental subtypes are accepted as they are. */
static __always_inline bool mptcp_option_valid(__u32 subtype, __u32 len, __u8 sub_byte, __u8 flags_byte,
					       __u8 tcp_flags)
{
	bool syn = tcp_flags & TCP_FLAG_SYN, ack = tcp_flags & TCP_FLAG_ACK;

	switch (subtype) {
	case MPTCP_SUB_CAPABLE: /* 3.1 */
		if (syn && !ack)
			return len == MPTCP_LEN_CAPABLE_SYN || len == MPTCP_LEN_CAPABLE_KEY;
		if (syn)
			return len == MPTCP_LEN_CAPABLE_KEY;
		return len == MPTCP_LEN_CAPABLE_ACK || len == MPTCP_LEN_CAPABLE_ACK_DATA ||
		       len == MPTCP_LEN_CAPABLE_ACK_DATA_CSUM;
	case MPTCP_SUB_JOIN: /* 3.2 */
		if (syn && !ack)
			return len == MPTCP_LEN_JOIN_SYN;
		if (syn)
			return len == MPTCP_LEN_JOIN_SYNACK;
		return len == MPTCP_LEN_JOIN_ACK;
	case MPTCP_SUB_DSS: /* 3.3 */
		if (len < MPTCP_LEN_DSS_BASE)
			return false;
		if (len == dss_len(flags_byte))
			return true;
		return (flags_byte & MPTCP_DSS_MAPPING) &&
		       len == dss_len(flags_byte) + MPTCP_DSS_CHECKSUM_LEN;
	case MPTCP_SUB_ADD_ADDR: /* 3.4.1 */
		return add_addr_valid(len, sub_byte);
	case MPTCP_SUB_REMOVE_ADDR: /* 3.4.2 */
		return len >= MPTCP_LEN_REMOVE_ADDR_MIN;
	case MPTCP_SUB_PRIO: /* 3.3.8 */
		return len == MPTCP_LEN_PRIO || len == MPTCP_LEN_PRIO_V0;
	case MPTCP_SUB_FAIL: /* 3.7 */
		return len == MPTCP_LEN_FAIL;
	case MPTCP_SUB_FASTCLOSE: /* 3.5 */
		return len == MPTCP_LEN_FASTCLOSE;
	case MPTCP_SUB_TCPRST: /* 3.6 */
		return len == MPTCP_LEN_TCPRST;
	default:
		return true;
	}
}

/* opt_byte reads opts[i]; the bound is already known to the caller, the
 * check keeps the verifier convinced without unrolling. */
static __always_inline __u8 opt_byte(const struct option_scan *s, __u32 i)
{
	if (i >= TCP_MAX_OPTIONS_LEN)
		return 0;
	return s->opts[i];
}

/* note_mptcp_option records in f the MPTCP option at off from the start of
 * the TCP header (length len, its subtype byte and the byte after it, 0 if
 * none): counted invalid when its length does not fit its subtype, else
 * located, first occurrence of its subtype only. */
static __always_inline void note_mptcp_option(struct mptcp_found *f, __u8 tcp_flags, __u32 off, __u32 len,
					      __u8 sub_byte, __u8 flags_byte)
{
	__u32 subtype = sub_byte >> 4;

	if (!mptcp_option_valid(subtype, len, sub_byte, flags_byte, tcp_flags)) {
		f->invalid |= 1U << subtype;
		return;
	}
	if (f->seen & (1U << subtype)) {
		/* Linux applies the last MP_PRIO of a segment that has RFC
		 * 8684's length: locate that one, the one the receiver obeys
		 * (the backup actor rewrites it). */
		if (subtype == MPTCP_SUB_PRIO && len == MPTCP_LEN_PRIO)
			f->off[MPTCP_SUB_PRIO] = off;
		return;
	}
	f->seen |= 1U << subtype;
	f->off[subtype & (MPTCP_SUBTYPES - 1)] = off;
}

/* scan_option is one step of the option walk, run under bpf_loop so the
 * verifier checks the step once instead of every path through 40 unrolled
 * iterations. Every option the kernel reads is visited, so every MPTCP
 * option is found, not only the first; the walk stops where the kernel's
 * does (see OPTS_END_EOL). Returns 1 to stop. */
static long scan_option(__u32 index, void *ctx)
{
	struct option_scan *s = ctx;
	__u32 pos = s->pos, len, bit;
	__u8 kind, sub_byte;

	if (pos >= s->optlen || pos >= TCP_MAX_OPTIONS_LEN)
		return 1;
	kind = opt_byte(s, pos);
	if (kind == TCPOPT_EOL) {
		s->found.flags |= OPTS_END_EOL;
		return 1;
	}
	if (kind == TCPOPT_NOP) {
		s->pos = pos + 1;
		return 0;
	}
	/* A kind without its length, a length below 2 or past the header:
	 * the kernel keeps what it read before and stops. */
	if (pos + 1 >= s->optlen) {
		s->found.flags |= OPTS_END_BROKEN;
		return 1;
	}
	len = opt_byte(s, pos + 1);
	if (len < 2 || pos + len > s->optlen) {
		s->found.flags |= OPTS_END_BROKEN;
		return 1;
	}
	s->pos = pos + len;
	/* The last window-scale option counts, as in the kernel's
	 * tcp_parse_options. */
	if (kind == TCPOPT_WSCALE && len == TCPOLEN_WSCALE) {
		__u8 shift = opt_byte(s, pos + 2);

		s->wscale = (shift > TCP_WSCALE_MAX ? TCP_WSCALE_MAX : shift) + 1;
		return 0;
	}
	if (kind != TCPOPT_MPTCP)
		return 0;

	if (len < MPTCP_LEN_MIN) {
		/* No subtype byte: the kernel reads the next byte as one. */
		s->found.flags |= OPTS_AMBIGUOUS;
		return 0;
	}
	sub_byte = opt_byte(s, pos + 2);
	bit = 1U << (sub_byte >> 4);
	if (s->occurred & bit)
		s->repeated |= bit;
	s->occurred |= bit;
	if ((sub_byte >> 4) == MPTCP_SUB_JOIN && (len == MPTCP_LEN_JOIN_SYN || len == MPTCP_LEN_JOIN_SYNACK))
		s->join_b = 1;
	note_mptcp_option(&s->found, s->tcp_flags, TCP_HDR_LEN + pos, len, sub_byte,
			  len > 3 ? opt_byte(s, pos + 3) : 0);
	return 0;
}

/* walk_tcp_options copies the options of the TCP header pkt describes and
 * walks them, for any layout read_common_options declines. Malformed only
 * when the header is not all in the packet (the kernel drops such a
 * segment); a broken option list is read up to the break, as the kernel
 * reads it. A global function: verified once, and the 40-byte copy lives in
 * its own frame. */
__noinline int walk_tcp_options(struct __sk_buff *skb, struct packet *pkt)
{
	struct option_scan scan = {};
	__u32 optlen;

	if (!skb || !pkt)
		return PARSE_MALFORMED;
	optlen = pkt->tcp_hlen;
	if (optlen <= TCP_HDR_LEN || optlen > TCP_HDR_LEN + TCP_MAX_OPTIONS_LEN)
		return PARSE_MALFORMED;
	optlen -= TCP_HDR_LEN;
	if (bpf_skb_load_bytes(skb, (__u32)pkt->l4_off + TCP_HDR_LEN, scan.opts, optlen))
		return PARSE_MALFORMED;
	scan.optlen = optlen;
	scan.tcp_flags = pkt->tcp_flags;
	/* Each step consumes at least one byte, so 40 steps cover the whole
	 * option space. */
	bpf_loop(TCP_MAX_OPTIONS_LEN, scan_option, &scan, 0);
	if ((scan.repeated & MPTCP_SUBTYPES_READ) ||
	    (scan.join_b && ((scan.occurred >> MPTCP_SUB_PRIO) & 1)) ||
	    ((scan.occurred >> MPTCP_SUB_JOIN) & (scan.occurred >> MPTCP_SUB_CAPABLE) & 1))
		scan.found.flags |= OPTS_AMBIGUOUS;
	pkt->mptcp = scan.found;
	pkt->wscale = scan.wscale;
	return PARSE_OK;
}

/* NOP, NOP, timestamps: the options of nearly every segment Linux sends
 * once the handshake is over (RFC 7323 appendix A's layout). */
#define TCPOPT_TS_ALIGNED  0x0101080a
#define TCPOLEN_TS_ALIGNED 12

/* read_common_options reads in place, without copying the options or
 * walking them, the two layouts of nearly every established segment: NOP
 * NOP timestamps alone, or followed by one MPTCP option that ends the
 * options, maybe padded to the 4-byte boundary with NOPs (a DSS on data and
 * DATA_ACKs: Linux follows a mapping without checksum with two NOPs). It
 * fills pkt->mptcp as walk_tcp_options would and returns true, or returns
 * false and leaves the packet to the walk (any other layout, EOL padding,
 * which ends the kernel's reading early, options beyond the linear data).
 * One MPTCP option of 4 bytes or more is never OPTS_AMBIGUOUS. */
static __always_inline bool read_common_options(struct __sk_buff *skb, struct packet *pkt)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 opt_off = (__u32)pkt->l4_off + TCP_HDR_LEN, optlen = pkt->tcp_hlen - TCP_HDR_LEN;
	__u32 len, pad;
	__u8 *p, *last;

	if (optlen < TCPOLEN_TS_ALIGNED || optlen > TCP_MAX_OPTIONS_LEN || opt_off > MAX_HDR_OFF)
		return false;
	p = data + opt_off;
	asm volatile("" : "+r"(p));
	if ((void *)(p + TCPOLEN_TS_ALIGNED) > data_end)
		return false;
	if (*(__be32 *)p != bpf_htonl(TCPOPT_TS_ALIGNED))
		return false;
	if (optlen == TCPOLEN_TS_ALIGNED)
		return true;
	/* The MPTCP option's kind, length, subtype and first flags byte. */
	if ((void *)(p + TCPOLEN_TS_ALIGNED + 4) > data_end)
		return false;
	len = p[TCPOLEN_TS_ALIGNED + 1];
	if (p[TCPOLEN_TS_ALIGNED] != TCPOPT_MPTCP || len < 4 || TCPOLEN_TS_ALIGNED + len > optlen)
		return false;
	pad = optlen - TCPOLEN_TS_ALIGNED - len;
	if (pad > 3)
		return false;
	/* All of it in the packet, as the walk's copy would require; the
	 * padding is in the last 4 bytes (optlen is a multiple of 4, at least
	 * 16 here). The mask bounds the offset for the verifier and keeps
	 * clang from folding the -4 into the accesses (the verifier wants
	 * non-negative offsets from the pointer it checked). */
	last = p + ((optlen - 4) & 0x3f);
	if ((void *)(last + 4) > data_end)
		return false;
	if ((pad >= 1 && last[3] != TCPOPT_NOP) || (pad >= 2 && last[2] != TCPOPT_NOP) ||
	    (pad >= 3 && last[1] != TCPOPT_NOP))
		return false;
	note_mptcp_option(&pkt->mptcp, pkt->tcp_flags, TCP_HDR_LEN + TCPOLEN_TS_ALIGNED, len,
			  p[TCPOLEN_TS_ALIGNED + 2], p[TCPOLEN_TS_ALIGNED + 3]);
	return true;
}

/* read_tcp_header fills pkt from the TCP header at off. */
static __always_inline int read_tcp_header(struct packet *pkt, const struct tcp_hdr *tcp, __u32 off)
{
	__u32 hlen = (tcp->doff_res >> 4) * 4;

	if (hlen < TCP_HDR_LEN)
		return PARSE_MALFORMED;
	pkt->l4_off = off;
	pkt->sport = tcp->source;
	pkt->dport = tcp->dest;
	pkt->tcp_flags = tcp->flags;
	pkt->tcp_hlen = hlen;
	return PARSE_OK;
}

/* read_options locates the MPTCP options of the TCP header pkt describes:
 * in place for the common layout, else by the walk. */
static __always_inline int read_options(struct __sk_buff *skb, struct packet *pkt)
{
	if (pkt->tcp_hlen == TCP_HDR_LEN || read_common_options(skb, pkt))
		return PARSE_OK;
	return walk_tcp_options(skb, pkt);
}

/* parse_packet_slow is the full parser: VLAN tags, IPv4 options, IPv6
 * extension headers, headers beyond the linear data. A global function:
 * verified once, its header copies in its own frame. */
__noinline int parse_packet_slow(struct __sk_buff *skb, struct packet *pkt)
{
	const struct tcp_hdr *tcp;
	struct tcp_hdr tcp_buf;
	__u32 off = 0;
	__u8 proto = 0;
	int ret;

	if (!skb || !pkt)
		return PARSE_MALFORMED;
	ret = parse_l3(skb, pkt, &off, &proto);
	if (ret != PARSE_OK)
		return ret;
	if (proto != IPPROTO_TCP)
		return PARSE_NOT_TCP;
	if (off > 0xffff - TCP_MAX_OPTIONS_LEN - sizeof(*tcp))
		return PARSE_MALFORMED;
	tcp = header_at(skb, off, sizeof(*tcp), &tcp_buf);
	if (!tcp)
		return PARSE_MALFORMED;
	ret = read_tcp_header(pkt, tcp, off);
	if (ret != PARSE_OK)
		return ret;
	return read_options(skb, pkt);
}

/* parse_headers_fast reads in place the headers of nearly every packet:
 * Ethernet without a VLAN tag, then IPv4 without options or IPv6 without
 * extension headers, then TCP, all in the linear data. It decides what the
 * full parser would for those, and returns PARSE_SLOW for anything else,
 * which the full parser then reads from the start. */
static __always_inline int parse_headers_fast(struct __sk_buff *skb, struct packet *pkt)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	const struct tcp_hdr *tcp;
	__u32 l4_off;
	__be16 proto;

	if (data + ETH_HLEN > data_end)
		return PARSE_SLOW;
	proto = *(__be16 *)(data + 12);
	if (proto == bpf_htons(ETH_P_IP)) {
		const struct ipv4_hdr *ip = data + ETH_HLEN;

		if ((void *)(ip + 1) > data_end || ip->ver_ihl != 0x45)
			return PARSE_SLOW; /* options, or not version 4 */
		/* The addresses first: the rate actor caps what is not TCP
		 * by them. */
		pkt->family = AF_INET;
		__builtin_memcpy(pkt->saddr, &ip->saddr, 4);
		__builtin_memcpy(pkt->daddr, &ip->daddr, 4);
		if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return ip->protocol == IPPROTO_TCP ? PARSE_UNREADABLE_TCP : PARSE_NOT_TCP;
		if (ip->protocol != IPPROTO_TCP)
			return PARSE_NOT_TCP;
		tcp = (const void *)(ip + 1);
		if ((void *)(tcp + 1) > data_end)
			return PARSE_SLOW;
		l4_off = ETH_HLEN + sizeof(*ip);
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		const struct ipv6_hdr *ip6 = data + ETH_HLEN;

		if ((void *)(ip6 + 1) > data_end || (*(__u8 *)ip6 >> 4) != 6)
			return PARSE_SLOW;
		pkt->family = AF_INET6;
		__builtin_memcpy(pkt->saddr, ip6->saddr, 16);
		__builtin_memcpy(pkt->daddr, ip6->daddr, 16);
		if (ip6->nexthdr != IPPROTO_TCP)
			return is_ipv6_ext_header(ip6->nexthdr) ? PARSE_SLOW : PARSE_NOT_TCP;
		tcp = (const void *)(ip6 + 1);
		if ((void *)(tcp + 1) > data_end)
			return PARSE_SLOW;
		l4_off = ETH_HLEN + sizeof(*ip6);
	} else if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
		return PARSE_SLOW;
	} else {
		return PARSE_NOT_TCP;
	}
	pkt->l3_off = ETH_HLEN;
	if (read_tcp_header(pkt, tcp, l4_off) != PARSE_OK)
		return PARSE_SLOW;
	return PARSE_OK;
}

/* parse_packet fills pkt (zeroed by the caller) for a TCP packet and
 * locates its MPTCP options. It never writes to the packet. The common
 * layout is read inline; anything else goes to the full parser. */
static __always_inline int parse_packet(struct __sk_buff *skb, struct packet *pkt)
{
	int ret;

	pkt->len = skb->len;
	ret = parse_headers_fast(skb, pkt);
	if (ret == PARSE_SLOW)
		return parse_packet_slow(skb, pkt);
	if (ret != PARSE_OK)
		return ret;
	return read_options(skb, pkt);
}
