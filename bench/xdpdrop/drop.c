// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// clang-format off
//go:build ignore
// clang-format on

/* The programs of the XDP-or-TC benchmark (bench/xdpdrop): the same minimal
 * drop of a join SYN flood at the two hooks, and the flood's sender.
 *
 *   xdp_drop (XDP on the receiving interface) -> XDP_DROP
 *   tc_drop  (TCX ingress of the same)        -> TC_ACT_SHOT
 *       a TCP SYN (not SYN-ACK) carrying MP_JOIN (RFC 8684 3.2) to an
 *       address in pod_net/pod_mask; anything else passes
 *   flood    (XDP, run by BPF_PROG_TEST_RUN in live-frame mode) -> XDP_TX
 *       gives each frame its own source port, so the flood is many
 *       4-tuples as a forged one would be, and keeps the TCP checksum right
 *   flood_nowhere: the same, then XDP_DROP (the sender's cost alone)
 *
 * They are not the datapath's programs: they parse only what deciding this
 * drop needs (Ethernet, IPv4, TCP and its options), so what the benchmark
 * compares is the hook, not the work done at it. */

#include <stdbool.h>
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define TCPOPT_EOL	    0
#define TCPOPT_NOP	    1
#define TCPOPT_MPTCP	    30
#define MPTCP_SUB_JOIN	    0x1
#define TCP_MAX_OPTIONS_LEN 40
#define IP_MF		    0x2000
#define IP_OFFSET	    0x1fff

/* TCX_NEXT hands the packet on to the hook's next program; the UAPI
 * headers of Debian 12 lack it. */
#ifndef TCX_NEXT
#define TCX_NEXT -1
#endif

/* The pods' network, in network byte order: set by the loader. */
volatile const __u32 pod_net = 0;
volatile const __u32 pod_mask = 0;

/* The flood's source ports: flood_port_base + (n % flood_ports); the
 * loader may narrow them. */
volatile const __u16 flood_port_base = 1024;
volatile const __u16 flood_ports = 64512;

/* Counter indexes: what each program did, counted per CPU. */
enum counter {
	COUNTER_XDP_DROPPED = 0,
	COUNTER_TC_DROPPED = 1,
	COUNTER_FLOOD_SENT = 2,
	COUNTER_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline __u64 *counter(enum counter c)
{
	__u32 key = c;

	return bpf_map_lookup_elem(&counters, &key);
}

/* join_syn_to_pod says whether the frame in [data, data_end) is a TCP SYN
 * carrying MP_JOIN to a pod address. MP_JOIN may come last (Linux sends it
 * after MSS, SACK permitted, timestamps and window scale), so the option
 * list is walked byte by byte up to its 40 bytes, skipping to where the next
 * option starts: the verifier then sees one position per iteration, not one
 * per way of reaching it. */
static __always_inline bool join_syn_to_pod(void *data, void *data_end)
{
	struct ethhdr *eth = data;
	__u32 next = 0, optlen;
	struct tcphdr *tcp;
	struct iphdr *ip;
	__u8 *opts;
	int i;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return false;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->ihl < 5 || ip->protocol != IPPROTO_TCP)
		return false;
	if ((ip->daddr & pod_mask) != pod_net || (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)))
		return false;
	tcp = (void *)ip + ip->ihl * 4;
	if ((void *)(tcp + 1) > data_end || !tcp->syn || tcp->ack || tcp->doff < 5)
		return false;
	opts = (__u8 *)(tcp + 1);
	optlen = tcp->doff * 4 - sizeof(*tcp);
	for (i = 0; i < TCP_MAX_OPTIONS_LEN; i++) {
		__u8 *p = opts + i;

		if (i >= optlen)
			return false;
		if (i < next)
			continue;
		if ((void *)(p + 1) > data_end || p[0] == TCPOPT_EOL)
			return false;
		if (p[0] == TCPOPT_NOP) {
			next = i + 1;
			continue;
		}
		if ((void *)(p + 3) > data_end || p[1] < 2)
			return false;
		/* RFC 8684 3.2: the subtype is the high nibble of the third
		 * byte. */
		if (p[0] == TCPOPT_MPTCP && p[1] >= 3 && p[2] >> 4 == MPTCP_SUB_JOIN)
			return true;
		next = i + p[1];
	}
	return false;
}

SEC("xdp")
int xdp_drop(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	__u64 *n;

	if (!join_syn_to_pod(data, data_end))
		return XDP_PASS;
	n = counter(COUNTER_XDP_DROPPED);
	if (n)
		(*n)++;
	return XDP_DROP;
}

SEC("tc")
int tc_drop(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *data_end = (void *)(long)skb->data_end;
	__u64 *n;

	if (!join_syn_to_pod(data, data_end))
		return TCX_NEXT;
	n = counter(COUNTER_TC_DROPPED);
	if (n)
		(*n)++;
	return TC_ACT_SHOT;
}

/* csum_replace2 is the TCP checksum after a 16-bit word of the header
 * changed from old to new (RFC 1624, eqn. 3): the rest of the segment need
 * not be read again. */
static __always_inline __u16 csum_replace2(__u16 check, __u16 old, __u16 new)
{
	__u32 sum = (__u16)~check + (__u16)~old + new;

	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

/* flood_frame gives the frame its port: frames are built from one template,
 * an Ethernet, IPv4 header without options and a TCP SYN. The kernel keeps a
 * frame's bytes from one use of its page to the next, so the port and
 * checksum are changed from whatever the frame holds. */
static __always_inline int flood_frame(struct xdp_md *ctx, int action)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct tcphdr *tcp = data + sizeof(struct ethhdr) + sizeof(struct iphdr);
	__u64 *n = counter(COUNTER_FLOOD_SENT);
	__u16 port;

	if (!n || (void *)(tcp + 1) > data_end)
		return XDP_ABORTED;
	port = bpf_htons(flood_port_base + (__u16)(*n % flood_ports));
	tcp->check = csum_replace2(tcp->check, tcp->source, port);
	tcp->source = port;
	(*n)++;
	return action;
}

/* flood sends each frame out of the interface the run names, to its veth
 * peer. */
SEC("xdp")
int flood(struct xdp_md *ctx)
{
	return flood_frame(ctx, XDP_TX);
}

/* flood_nowhere builds the frames as flood does and drops them: the
 * sender's own cost, without the transfer or the receiving side. */
SEC("xdp")
int flood_nowhere(struct xdp_md *ctx)
{
	return flood_frame(ctx, XDP_DROP);
}

char __license[] SEC("license") = "GPL";
