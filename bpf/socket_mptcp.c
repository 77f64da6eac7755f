// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The socket program of podMPTCP.transparent kernel: a TCP socket that a
 * process in a selected pod's network namespace creates is an MPTCP one,
 * whatever the program asked for, static binaries and io_uring included.
 * It modifies the return of the kernel's update_socket_protocol (Linux 6.6
 * and later), which exists for this, and is global: the namespace check
 * (socket_mptcp.h) keeps every other socket of the node as it was asked. A
 * kernel that refuses tracing programs (lockdown) cannot load it; the
 * agent then says so in the node state (internal/socketmptcp). */
#include "socket_mptcp.h"

#include <bpf/bpf_tracing.h>

/* The fields read from the kernel's own structures, relocated to this
 * kernel's layout when the program loads (CO-RE). */
struct net {
	__u64 net_cookie;
} __attribute__((preserve_access_index));

struct nsproxy {
	struct net *net_ns;
} __attribute__((preserve_access_index));

struct task_struct {
	struct nsproxy *nsproxy;
} __attribute__((preserve_access_index));

/* An fmod_ret program's 0 lets the next program on the hook, then the
 * kernel's own function, decide; anything else is the answer, and skips
 * both. So the program answers only for the sockets it changes, and leaves
 * every other socket to whoever else hooks there. */
SEC("fmod_ret/update_socket_protocol")
int BPF_PROG(socket_mptcp, int family, int type, int protocol)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct nsproxy *ns = task->nsproxy;

	/* A task that is exiting has no namespaces left. */
	if (!ns)
		return 0;
	if (!socket_mptcp_wanted(family, type, protocol, ns->net_ns->net_cookie))
		return 0;
	return IPPROTO_MPTCP;
}

char _license[] SEC("license") = "Dual BSD/GPL";
