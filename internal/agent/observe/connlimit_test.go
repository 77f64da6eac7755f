package observe

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

// One remote address holds at most connsPerSource connections to the
// agent's HTTP port: the ones it opens beyond are closed unanswered, while
// another address (the kubelet's probe, Prometheus) is answered; a
// connection it closes gives its place back.
func TestOneSourceHoldsAtMostItsShareOfConnections(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	addr, wait, err := Serve(ctx, "127.0.0.1:0", ok, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer wait()
	defer cancel()
	dial := func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: time.Second}
		c, err := d.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	// get sends one request on c and says whether it was answered.
	get := func(c net.Conn) bool {
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n"); err != nil {
			return false
		}
		buf := make([]byte, 64)
		n, _ := c.Read(buf)
		return n > 0
	}
	var held []net.Conn
	for range connsPerSource {
		c := dial("127.0.0.2")
		if !get(c) {
			t.Fatalf("connection %d of the source was not answered", len(held)+1)
		}
		held = append(held, c)
	}
	if get(dial("127.0.0.2")) {
		t.Errorf("connection %d of one source was answered, want at most %d open", connsPerSource+1, connsPerSource)
	}
	if !get(dial("127.0.0.3")) {
		t.Error("another source was not answered while one held its share")
	}
	_ = held[0].Close()
	time.Sleep(50 * time.Millisecond) // the server sees the close
	if !get(dial("127.0.0.2")) {
		t.Error("a connection the source closed did not give its place back")
	}
}
