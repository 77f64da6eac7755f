// Package xdpdrop measures what a node pays per packet of a join SYN flood
// arriving on a NIC, dropped by XDP, dropped by TC, or left to the stack
// (docs/benchmarks.md, "XDP or TC for dropping a flood"). Its programs
// (drop.c) are written for the benchmark, not the datapath's.
//
//	make bench-xdpdrop    (go test -run '^$' -bench . -benchtime=1x ./bench/xdpdrop/)
//
// With BENCH_REPORT=<file> the benchmark rewrites that file's section.
package xdpdrop

// The objects are generated from drop.c and committed, so the benchmark
// needs no clang. `make generate-bpf` regenerates them; CI checks they match.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel drop drop.c -- -I/usr/include/x86_64-linux-gnu
