package preload

// The library is built here and committed, as the datapath's BPF objects
// are: `make generate` rebuilds it and `make verify` checks the committed
// bytes are what this source and toolchain give (no build ID, no debug
// paths, so the build is reproducible).
//go:generate clang -O2 -Wall -Werror -std=c11 -fPIC -shared -fvisibility=hidden -Wl,--build-id=none -o libmptcp-socket.so lib/mptcp_socket.c -ldl
