/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Which sockets the socket program makes MPTCP: shared by the program
 * (bpf/socket_mptcp.c) and its test (bpf/test/socket_mptcp_check.c), which
 * runs the same decision through a program type every kernel accepts. */
#pragma once

#include "common.h"

#define SOCK_STREAM   1
#define IPPROTO_IP    0
#define IPPROTO_TCP   6
#define IPPROTO_MPTCP 262

/* The network namespaces, by cookie, whose TCP sockets become MPTCP: the
 * selected pods', which the agent writes. The value is unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LIMIT_PODS);
	__type(key, __u64);
	__type(value, __u8);
} transparent_netns SEC(".maps");

/* socket_mptcp_wanted says whether a socket(family, type, protocol) call in
 * the namespace of cookie is to be MPTCP: a TCP stream of IPv4 or IPv6
 * (protocol 0 or IPPROTO_TCP) in a listed namespace. type has no
 * SOCK_NONBLOCK or SOCK_CLOEXEC here: the kernel takes the flags off before
 * it asks. */
static __always_inline bool socket_mptcp_wanted(int family, int type, int protocol, __u64 cookie)
{
	if (family != AF_INET && family != AF_INET6)
		return false;
	if (type != SOCK_STREAM || (protocol != IPPROTO_IP && protocol != IPPROTO_TCP))
		return false;
	return bpf_map_lookup_elem(&transparent_netns, &cookie) != NULL;
}
