package podnet

import (
	"context"
	"log/slog"
	"net/netip"
	"os/exec"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// A connection that closes whole is reported as a connection, not subflow
// by subflow: the path manager gives every subflow it still had back to
// the datapath, on the side that opened it and on the side that accepted
// it, so that a pod's short connections free their entries (here after a
// grace of a millisecond; by default 10 s).
func TestAClosedConnectionGivesBackEverySubflow(t *testing.T) {
	bed := newPMBed(t)
	server := Pod{Name: "apps.server-0", UID: "uid-2", NetNS: bed.serverNS, IPs: []netip.Addr{netip.MustParseAddr(serverAddr)}}
	var mu sync.Mutex
	heard := map[subflowKey]bool{}
	p := NewPathManagers(slog.New(slog.DiscardHandler), PathManagerOptions{ClosedEntryGrace: time.Millisecond, SubflowClosed: func(local, remote netip.AddrPort, _ uint32, _ time.Time) (uint32, error) {
		mu.Lock()
		defer mu.Unlock()
		heard[subflowKey{local, remote}] = true
		return testPath, nil
	}})
	t.Cleanup(p.Stop)
	if errs := p.Sync(context.Background(), []Want{{Pod: bed.client, Joins: 1}, {Pod: server, Joins: 1}}); errs != nil {
		t.Fatal(errs)
	}
	conn := bed.dial(t)
	initial := netip.MustParseAddrPort(conn.LocalAddr().String())
	join := bed.waitForJoin(t, initial.Port())
	// The join's events reach the server's path manager too.
	time.Sleep(100 * time.Millisecond)
	conn.Close()

	remote := netip.MustParseAddrPort(serverAddr + ":5201")
	joinLocal := netip.AddrPortFrom(initial.Addr(), join)
	want := []subflowKey{
		{initial, remote}, {joinLocal, remote}, // the client's
		{remote, initial}, {remote, joinLocal}, // the server's, as it sends them
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		var missing []subflowKey
		for _, k := range want {
			if !heard[k] {
				missing = append(missing, k)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the connection closed, the datapath did not hear of %v closing (heard %v)", missing, heard)
		}
	}
}

// The kernel reports a connection closed when its application lets go of
// the socket, while the subflows still send what it wrote: their entries
// keep placing and capping those packets, and go only once the subflows'
// sockets have.
func TestAClosedConnectionsSubflowsAreGivenBackOnlyOnceTheyStopSending(t *testing.T) {
	bed := newPMBed(t)
	// 5 Mbit/s out of the client: what the socket holds at the close
	// takes a second or more to drain.
	if out, err := exec.Command("tc", "-n", "mptpm-c-"+bed.id, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "5mbit", "burst", "16kb", "latency", "10s").CombinedOutput(); err != nil {
		t.Fatalf("tc: %v: %s", err, out)
	}
	fd, err := netnsutil.Open(bed.client.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	isOpen := func(k subflowKey) bool {
		socks, err := mptcpnl.ListOpenTCPSockets(fd)
		if err != nil {
			t.Error(err)
		}
		for _, e := range socks {
			if e.Local == k.local && e.Remote == k.remote {
				return true
			}
		}
		return false
	}
	var initial subflowKey
	givenBack := make(chan bool, 1) // whether its socket was still open then
	p := NewPathManagers(slog.New(slog.DiscardHandler), PathManagerOptions{ClosedEntryGrace: time.Millisecond, SubflowClosed: func(local, remote netip.AddrPort, _ uint32, _ time.Time) (uint32, error) {
		if k := (subflowKey{local, remote}); k == initial {
			givenBack <- isOpen(k)
		}
		return testPath, nil
	}})
	t.Cleanup(p.Stop)
	if errs := p.Sync(context.Background(), []Want{{Pod: bed.client}}); errs != nil {
		t.Fatal(errs)
	}
	conn := bed.dial(t)
	initial = subflowKey{netip.MustParseAddrPort(conn.LocalAddr().String()), netip.MustParseAddrPort(serverAddr + ":5201")}
	if _, err := conn.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if !isOpen(initial) {
		t.Fatal("the first subflow's socket is gone at the close: nothing left to send, the test shows nothing")
	}
	select {
	case open := <-givenBack:
		if open {
			t.Error("the closed connection's first subflow was given back while its socket was still open, sending what the application wrote")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the closed connection's first subflow was never given back")
	}
}

// A closed connection's subflows keep their entries for the grace after its
// close, though their sockets are gone: what the tables say of a connection
// that just ended stays readable a while.
func TestAClosedConnectionsEntriesStayForTheGrace(t *testing.T) {
	bed := newPMBed(t)
	const grace = 1500 * time.Millisecond
	heard := make(chan time.Time, 4)
	p := NewPathManagers(slog.New(slog.DiscardHandler), PathManagerOptions{ClosedEntryGrace: grace, SubflowClosed: func(netip.AddrPort, netip.AddrPort, uint32, time.Time) (uint32, error) {
		heard <- time.Now()
		return testPath, nil
	}})
	t.Cleanup(p.Stop)
	if errs := p.Sync(context.Background(), []Want{{Pod: bed.client}}); errs != nil {
		t.Fatal(errs)
	}
	conn := bed.dial(t)
	closed := time.Now()
	conn.Close()
	select {
	case at := <-heard:
		if after := at.Sub(closed); after < grace {
			t.Errorf("the closed connection's first subflow was given back %v after the close, within the grace of %v", after, grace)
		}
	case <-time.After(grace + 3*closeCheckInterval):
		t.Fatal("the closed connection's first subflow was never given back")
	}
}
