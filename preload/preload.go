// Package preload holds libmptcp-socket.so (lib/mptcp_socket.c): a library
// that, loaded with LD_PRELOAD, makes a program's TCP sockets MPTCP ones,
// for programs that call libc's socket() and cannot be changed. The agent
// binary carries it and writes it into a pod's volume (agent
// -install-preload), where the webhook's init container puts it.
package preload

import (
	_ "embed"
	"os"
	"path/filepath"
)

// Library is the file name of the library.
const Library = "libmptcp-socket.so"

// Bytes is the library, for linux/amd64 with glibc (built by gen.go).
//
//go:embed libmptcp-socket.so
var Bytes []byte

// Install writes the library into dir, readable by every user (the pod's
// containers run as any uid), and returns its path.
func Install(dir string) (string, error) {
	path := filepath.Join(dir, Library)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, Bytes, 0o644); err != nil {
		return "", err
	}
	// WriteFile's mode is cut by the umask.
	if err := os.Chmod(tmp, 0o644); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}
