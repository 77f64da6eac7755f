// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * A middlebox for the test bed that strips MPTCP's MP_CAPABLE option from the
 * SYN-ACKs it forwards, as some firewalls and TCP normalisers do with options
 * they do not know. The option's bytes become NOPs; the TCP checksum is left
 * as it is (between network namespaces the receiving kernel trusts a checksum
 * it has not computed yet, as for the bed's corruption filter). The client
 * then sees a server that does not speak MPTCP, and the server sees the
 * client's ACK drop the MPTCP its SYN offered: the server's connection falls
 * back to TCP after negotiating MPTCP (MPTcpExtMPCapableFallbackACK).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define MAX_OPTIONS	    40
#define TCPOPT_EOL	    0
#define TCPOPT_NOP	    1
#define TCPOPT_MPTCP	    30
#define MPTCPOPT_MP_CAPABLE 0

static const __u8 nops[MAX_OPTIONS] = {
    [0 ... MAX_OPTIONS - 1] = TCPOPT_NOP,
};

/* stripped counts the SYN-ACKs changed, for the test to read. */
__u64 stripped;

/* walk is the state of a walk over one SYN-ACK's options. */
struct walk {
	struct __sk_buff *skb;
	__u32 base; /* the options' offset in the packet */
	__u32 len;  /* their length */
	__u32 at;   /* the option looked at next */
	int changed;
	__u8 opts[MAX_OPTIONS];
};

/* step looks at the option at w->at: an MP_CAPABLE becomes NOPs. A callback
 * of bpf_loop, verified once however many options a packet has. */
static long step(__u64 index, void *ctx)
{
	struct walk *w = ctx;
	__u32 at = w->at;
	__u8 kind, len;

	if (at >= w->len || at > MAX_OPTIONS - 3)
		return 1;
	kind = w->opts[at];
	if (kind == TCPOPT_EOL)
		return 1;
	if (kind == TCPOPT_NOP) {
		w->at = at + 1;
		return 0;
	}
	len = w->opts[at + 1];
	if (len < 2 || at + len > w->len)
		return 1;
	if (kind == TCPOPT_MPTCP && len > 2 && (w->opts[at + 2] >> 4) == MPTCPOPT_MP_CAPABLE) {
		if (len > MAX_OPTIONS || bpf_skb_store_bytes(w->skb, w->base + at, nops, len, 0))
			return 1;
		w->changed = 1;
	}
	w->at = at + len;
	return 0;
}

SEC("tc")
int strip_mp_capable(struct __sk_buff *skb)
{
	struct walk w = {.skb = skb};
	struct tcphdr tcp;
	struct iphdr ip;
	__u32 tcp_off;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_UNSPEC;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) || ip.protocol != IPPROTO_TCP)
		return TC_ACT_UNSPEC;
	tcp_off = ETH_HLEN + ip.ihl * 4;
	if (bpf_skb_load_bytes(skb, tcp_off, &tcp, sizeof(tcp)) || !tcp.syn || !tcp.ack)
		return TC_ACT_UNSPEC;
	w.len = tcp.doff * 4;
	if (w.len <= sizeof(tcp) || w.len > sizeof(tcp) + MAX_OPTIONS)
		return TC_ACT_UNSPEC;
	w.len -= sizeof(tcp);
	w.base = tcp_off + sizeof(tcp);
	if (bpf_skb_load_bytes(skb, w.base, w.opts, w.len))
		return TC_ACT_UNSPEC;
	bpf_loop(MAX_OPTIONS, step, &w, 0);
	if (w.changed)
		__sync_fetch_and_add(&stripped, 1);
	return TC_ACT_UNSPEC;
}

char _license[] SEC("license") = "Dual BSD/GPL";
