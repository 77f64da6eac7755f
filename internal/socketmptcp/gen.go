// Package socketmptcp is podMPTCP.transparent kernel on a node: a BPF
// program on the kernel's update_socket_protocol hook makes the TCP
// sockets that processes in chosen network namespaces create MPTCP ones,
// whatever the program asked for. The agent chooses the namespaces of the
// pods whose policy says kernel.
//
// The hook takes a tracing program (fmod_ret), which kernels in lockdown
// refuse, and exists from Linux 6.6: where Load fails, the agent reports
// the reason in its node state and changes nothing (docs/transparent.md).
package socketmptcp

// The object is generated from bpf/ and committed, as the datapath's is.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel socketMPTCP ../../bpf/socket_mptcp.c -- -I../../bpf/include -I/usr/include/x86_64-linux-gnu
