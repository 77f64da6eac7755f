// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * A filter for tests of held joins, attached where a client's link receives:
 * once keep_port is set, it drops every segment from server_port to any
 * client port but keep_port (the connection's first subflow), SYN-ACKs
 * excepted. A join the client opens then gets its SYN-ACK, so the client
 * sees it established, and nothing after: the acceptor's answer to the
 * join's third ACK never arrives, and the join is never fully established
 * at the client.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

/* Host byte order; set by the test. keep_port 0 lets everything through. */
volatile __u16 server_port;
volatile __u16 keep_port;

/* dropped counts the segments dropped, for the test to read. */
__u64 dropped;

SEC("tc")
int drop_join_answers(struct __sk_buff *skb)
{
	struct tcphdr tcp;
	struct iphdr ip;

	if (!keep_port || skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_UNSPEC;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) || ip.protocol != IPPROTO_TCP)
		return TC_ACT_UNSPEC;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + ip.ihl * 4, &tcp, sizeof(tcp)))
		return TC_ACT_UNSPEC;
	if (bpf_ntohs(tcp.source) != server_port || bpf_ntohs(tcp.dest) == keep_port || tcp.syn)
		return TC_ACT_UNSPEC;
	__sync_fetch_and_add(&dropped, 1);
	return TC_ACT_SHOT;
}

char _license[] SEC("license") = "Dual BSD/GPL";
