package bpfutil

// The filter of DropJoinAnswers is generated from bpf/test/drop_join_answers.c
// and committed, as the datapath's objects are (make generate-bpf).
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel dropJoinAnswers ../../../bpf/test/drop_join_answers.c -- -I/usr/include/x86_64-linux-gnu
