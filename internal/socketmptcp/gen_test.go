package socketmptcp

// The socket program's decision as a syscall program, for the tests
// (check_test.go); generated into _test files, so the agent does not carry it.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel -type socket_call socketCheck ../../bpf/test/socket_mptcp_check.c -- -I../../bpf/include -I/usr/include/x86_64-linux-gnu
