package main

import (
	"github.com/mptcp-operator/mptcp-operator/hack/traffic/stream"

	"bytes"
	"encoding/json"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// loopbackServer listens on loopback and hands every connection to s, as
// serve does; stop closes the listener and returns once no more
// connections can be handed over (serve drains only then).
func loopbackServer(t *testing.T, s *server) (addr net.Addr, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.handle(c.(*net.TCPConn))
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { ln.Close(); <-done }) }
	t.Cleanup(stop)
	return ln.Addr(), stop
}

// lines returns the report lines s has written so far.
func lines(t *testing.T, s *server, out *bytes.Buffer) []ServerReport {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var reps []ServerReport
	for _, l := range bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var r ServerReport
		if err := json.Unmarshal(l, &r); err != nil {
			t.Fatal(err)
		}
		reps = append(reps, r)
	}
	return reps
}

// A sender reports once the server has closed the connection; by then the
// server's line must be written, so a test reading both never waits or
// pairs a sender with nothing.
func TestServerReportsBeforeItCloses(t *testing.T) {
	var out bytes.Buffer
	s := &server{out: &out, window: time.Second, open: map[*net.TCPConn]bool{}}
	addr, _ := loopbackServer(t, s)
	for i := range 20 {
		r := sendOne(addr.String(), dialMode{}, "", 5, i, 0, 5*time.Second, 100_000, 0, joinWait{})
		if r.Error != "" {
			t.Fatal(r.Error)
		}
		got := lines(t, s, &out)
		if len(got) != i+1 {
			t.Fatalf("after connection %d closed, the server had written %d lines", i, len(got))
		}
		if last := got[i]; last.Remote != r.Local || last.SHA256 != r.SHA256 || !last.Verification.Verified || len(last.Verification.Ranges) != 0 {
			t.Fatalf("server line %+v does not match sender %+v", last, r)
		}
	}
}

// A paced connection writes no faster than its rate: over loopback, which
// would take the stream at gigabits, 8 Mbit/s for a second is 1 MB.
func TestPacedSenderHoldsItsRate(t *testing.T) {
	var out bytes.Buffer
	s := &server{out: &out, window: time.Second, open: map[*net.TCPConn]bool{}}
	addr, _ := loopbackServer(t, s)
	r := sendOne(addr.String(), dialMode{}, "", 5, 0, time.Second, 5*time.Second, 0, 1e6, joinWait{})
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	if r.Bytes < 0.9e6 || r.Bytes > 1.1e6 {
		t.Errorf("paced at 1 MB/s for 1 s: sent %d bytes, want 1 MB +-10%%", r.Bytes)
	}
}

// A server stopped while a connection is open reports what arrived,
// marked stopped, instead of dropping the connection without a line.
func TestServerStoppedReportsOpenConnections(t *testing.T) {
	var out bytes.Buffer
	s := &server{out: &out, window: time.Second, open: map[*net.TCPConn]bool{}}
	addr, stop := loopbackServer(t, s)
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(stream.Preamble(1, 0)); err != nil {
		t.Fatal(err)
	}
	for len(lines(t, s, &out)) == 0 && s.openCount() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	s.drain(100 * time.Millisecond)
	got := lines(t, s, &out)
	if len(got) != 1 || !got[0].Stopped || got[0].Bytes != preambleLen {
		t.Fatalf("after drain: %+v, want one line, stopped, with the %d bytes sent", got, preambleLen)
	}
}

func (s *server) openCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.open)
}

// -go-default stands for programs that never choose: what Go gives them
// is MPTCP for listeners and TCP for dialers (Go 1.24 and later, this
// module's go directive), which GODEBUG multipathtcp changes and the
// transparent e2e checks rely on.
func TestGoDefaultsAreMPTCPListenersAndTCPDialers(t *testing.T) {
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, c := range []struct {
		mptcpDialer, want bool
	}{{true, true}, {false, false}} {
		var d net.Dialer
		if c.mptcpDialer {
			d.SetMultipathTCP(true)
		}
		conn, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		dialed, _ := conn.(*net.TCPConn).MultipathTCP()
		accepted, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		got, _ := accepted.(*net.TCPConn).MultipathTCP()
		if got != c.want || (!c.mptcpDialer && dialed) {
			t.Errorf("dialer asking MPTCP %v: the default listener's connection MPTCP %v (want %v), the dialer's %v", c.mptcpDialer, got, c.want, dialed)
		}
		conn.Close()
		accepted.Close()
	}
}

// With -await-after, a sender waiting for joins writes that much of its
// stream first (a path manager that opens joins only once a connection has
// carried as much would never open them on the preamble alone), nothing
// more while it waits, then the rest. Loopback has no path manager to open
// joins, so the wait runs to its timeout: halfway through it, the receiver
// has exactly the first bytes.
func TestAwaitAfterSendsTheStreamsFirstBytesBeforeWaiting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // MPTCP where the kernel has it
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var received atomic.Int64
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			received.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	const after, total, wait = 300_000, 400_000, 600 * time.Millisecond
	done := make(chan SenderReport)
	go func() {
		done <- sendOne(ln.Addr().String(), dialMode{mptcp: true}, "", 7, 0, 0, 5*time.Second, total, 0,
			joinWait{want: 1, timeout: wait, after: after})
	}()
	time.Sleep(wait / 2)
	during := received.Load()
	r := <-done
	if r.Error != "" || !r.MPTCP {
		t.Fatalf("sender %+v: want an MPTCP connection (net.mptcp.enabled)", r)
	}
	if during != after || !r.JoinWaitTimedOut || r.Bytes != total {
		t.Fatalf("the receiver had %d bytes halfway through the wait, the sender %+v: want %d, the wait timed out, %d sent",
			during, r, after, total)
	}
}
