package podnet

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
)

// joinsWithin is how many joins conn has as soon as it has one, or after
// wait.
func joinsWithin(t *testing.T, conn net.Conn, wait time.Duration) int {
	t.Helper()
	var n int
	for deadline := time.Now().Add(wait); ; time.Sleep(5 * time.Millisecond) {
		info, err := mptcpnl.SocketInfo(conn.(*net.TCPConn))
		if err != nil {
			t.Fatal(err)
		}
		n = int(info.Subflows)
		if n >= 1 || time.Now().After(deadline) {
			return n
		}
	}
}

// A connection waits for its joins until it has carried the threshold: a
// short one gets none, one that carries more gets them once it passed it.
// A threshold changed while the path manager runs reaches the pod's next
// connections; one already waiting keeps the threshold it started with.
func TestJoinsWaitForTheThreshold(t *testing.T) {
	bed := newPMBed(t)
	const threshold = 256 << 10
	p := startPathManagers(t, Want{Pod: bed.client, Joins: 1, JoinAfterBytes: threshold})

	short := bed.dial(t)
	defer short.Close()
	if n := joinsWithin(t, short, 300*time.Millisecond); n != 0 {
		t.Fatalf("a connection that carried 5 bytes of a threshold of %d has %d joins, want none", threshold, n)
	}

	long := bed.dial(t)
	defer long.Close()
	if _, err := long.Write(make([]byte, threshold/2)); err != nil {
		t.Fatal(err)
	}
	if n := joinsWithin(t, long, 300*time.Millisecond); n != 0 {
		t.Fatalf("a connection at half its threshold has %d joins, want none yet", n)
	}
	if _, err := long.Write(make([]byte, threshold/2)); err != nil {
		t.Fatal(err)
	}
	if n := joinsWithin(t, long, 2*time.Second); n != 1 {
		t.Fatalf("a connection past its threshold has %d joins after 2 s, want 1", n)
	}

	// The rule now opens joins at once.
	if errs := p.Sync(context.Background(), []Want{{Pod: bed.client, Joins: 1}}); errs != nil {
		t.Fatal(errs)
	}
	if n := bed.joinsOfANewConnection(t); n != 1 {
		t.Fatalf("a new connection after the threshold went to 0 has %d joins, want 1 at once", n)
	}
	if n := joinsWithin(t, short, 100*time.Millisecond); n != 0 {
		t.Fatalf("a connection that waited before the change has %d joins, want none: it keeps its threshold", n)
	}
	if _, err := short.Write(make([]byte, threshold)); err != nil {
		t.Fatal(err)
	}
	if n := joinsWithin(t, short, 3*time.Second); n != 1 {
		t.Fatalf("the older connection, past its threshold after a long wait, has %d joins after 3 s, want 1", n)
	}
}

// The readings of waiting connections come often while they are young,
// when bulk flows pass the threshold, then more and more rarely.
func TestWaitingConnectionsAreReadLessOftenAsTheyAge(t *testing.T) {
	for _, c := range []struct{ age, want time.Duration }{
		{0, watchInterval},
		{watchSlowAfter - time.Millisecond, watchInterval},
		{watchSlowAfter, watchSlowAfter / 10},
		{5 * time.Second, 500 * time.Millisecond},
		{time.Hour, maxWatchInterval},
	} {
		if got := nextWatch(c.age); got != c.want {
			t.Errorf("a connection waiting for %v is read again after %v, want %v", c.age, got, c.want)
		}
	}
}
