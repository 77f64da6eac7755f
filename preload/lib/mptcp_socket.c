// SPDX-License-Identifier: Apache-2.0
//
// libmptcp-socket: loaded with LD_PRELOAD into a program that opens plain
// TCP sockets, it opens MPTCP sockets in their place, so that the kernel
// negotiates MPTCP on the program's connections and falls back to TCP on
// its own where the peer does not speak it.
//
// Only what a TCP socket can be is changed: socket(AF_INET or AF_INET6,
// SOCK_STREAM with any of SOCK_NONBLOCK and SOCK_CLOEXEC, 0 or
// IPPROTO_TCP). Where MPTCP is refused, for whatever reason (the kernel's
// net.mptcp.enabled=0, a kernel built without it, a seccomp filter or a
// security module that allows TCP only), the program's own call is made:
// the library never makes a socket() fail that would have succeeded.
// Every other call passes through unchanged.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/socket.h>

#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif

typedef int (*socket_fn)(int, int, int);

// The next definition of socket() after this library: libc's, or another
// preloaded library's. Looked up when the library is loaded, before the
// program runs (a lookup from inside a signal handler would not be safe);
// a call made earlier, by another library's constructor, looks it up then.
static _Atomic(socket_fn) next_socket;

static socket_fn libc_socket(void)
{
	socket_fn fn = atomic_load_explicit(&next_socket, memory_order_acquire);

	if (!fn) {
		fn = (socket_fn)dlsym(RTLD_NEXT, "socket");
		atomic_store_explicit(&next_socket, fn, memory_order_release);
	}
	return fn;
}

__attribute__((constructor)) static void resolve(void)
{
	libc_socket();
}

static int is_tcp(int domain, int type, int protocol)
{
	int kind = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);

	return (domain == AF_INET || domain == AF_INET6) && kind == SOCK_STREAM &&
	       (protocol == 0 || protocol == IPPROTO_TCP);
}

__attribute__((visibility("default"))) int socket(int domain, int type, int protocol)
{
	socket_fn fn = libc_socket();
	int fd, saved;

	if (!fn) {
		errno = ENOSYS;
		return -1;
	}
	if (!is_tcp(domain, type, protocol))
		return fn(domain, type, protocol);

	saved = errno;
	fd = fn(domain, type, IPPROTO_MPTCP);
	if (fd >= 0)
		return fd;
	// The program's own call decides: if TCP fails too, it fails as it
	// would have without the library, with TCP's errno.
	errno = saved;
	return fn(domain, type, protocol);
}
