// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The socket program's decision (socket_mptcp.h) as a syscall program, which
 * a test runs with arguments of its choosing where the kernel refuses the
 * fmod_ret program itself (internal/socketmptcp's tests). */
#include "socket_mptcp.h"

struct socket_call {
	int family;
	int type;
	int protocol;
	int result;
	__u64 cookie;
};

SEC("syscall")
int socket_mptcp_check(struct socket_call *call)
{
	call->result = socket_mptcp_wanted(call->family, call->type, call->protocol, call->cookie)
			   ? IPPROTO_MPTCP
			   : call->protocol;
	return 0;
}

char _license[] SEC("license") = "Dual BSD/GPL";
