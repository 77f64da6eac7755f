package testbed

// The middlebox of StripMPCapable is generated from bpf/test/strip_mp_capable.c and
// committed, as the datapath's objects are (make generate-bpf).
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel stripMPCapable ../../bpf/test/strip_mp_capable.c -- -I/usr/include/x86_64-linux-gnu
