package testutil

import (
	"net"
	"testing"
)

// FreePort is a TCP port on 127.0.0.1 that nothing listened on a moment
// ago: the kernel picks it for a listener that is closed at once. A server
// the test starts on it may still lose it to another process in between.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
