// Package preload builds libmptcp-socket.so (lib/mptcp_socket.c): a library
// that, loaded with LD_PRELOAD, makes a program's TCP sockets MPTCP ones,
// for programs that call libc's socket() and cannot be changed.
package preload

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Library is the file name of the built library.
const Library = "libmptcp-socket.so"

// Source is the library's C source, in this package's directory.
func Source() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "lib", "mptcp_socket.c")
}

// Build compiles the library into dir with clang (the toolchain the
// datapath's BPF programs are built with) and returns its path. The build
// is reproducible: no build ID, no debug paths.
func Build(dir string) (string, error) {
	out := filepath.Join(dir, Library)
	cmd := exec.Command("clang", "-O2", "-Wall", "-Werror", "-std=c11", "-fPIC", "-shared", "-fvisibility=hidden",
		"-Wl,--build-id=none", "-o", out, Source(), "-ldl")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %v: %s", Library, err, b)
	}
	return out, nil
}
