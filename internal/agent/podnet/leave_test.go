package podnet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// A path goes down while a subflow on it is recovering from losses (here
// no acknowledgement reaches the client, so its retransmission timer backs
// off): LeavePath closes that subflow, the datapath hears of the
// close, and no join replaces it while the path is down; the connection
// goes on over its other subflow. A healthy subflow on the path, or one
// whose connection has nothing elsewhere, is left alone. When the path is
// back, PathBack opens the join that replaces the closed subflow.
func TestASubflowRecoveringOnAPathThatWentDownIsClosedAndReplacedWhenItIsBack(t *testing.T) {
	bed := newPMBed(t)
	var mu sync.Mutex
	var heard []subflowKey
	p := bed.clientPathManager(t, func(k subflowKey) uint32 {
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, k)
		return testPath
	})
	conn := bed.dial(t)
	defer conn.Close()
	first := netip.MustParseAddrPort(conn.LocalAddr().String())
	server := netip.MustParseAddrPort(serverAddr + ":5201")
	join := bed.waitForJoin(t, first.Port())
	joinKey := subflowKey{netip.AddrPortFrom(first.Addr(), join), server}
	const path = testPath
	// onPath says the subflows from which are on the path, and the
	// others on a live one.
	onPath := func(which ...netip.AddrPort) SubflowPaths {
		return func(local, remote netip.AddrPort) (bool, bool) {
			on := remote == server && slices.Contains(which, local)
			return on, !on
		}
	}

	// Healthy subflows are not closed, whatever path they are on.
	if n := p.LeavePath(path, onPath(first)); n != 0 {
		t.Fatalf("LeavePath closed %d healthy subflows, want none", n)
	}
	p.PathBack(path)

	// The server's answers stop reaching the client (a blackhole route
	// to it), so that the subflows with data in flight retransmit, until
	// one is listed as recovering: that one is on the path going down.
	// (Which subflow the connection's scheduler has sent on is its own
	// choice.) Writes are bounded in time: with no acknowledgement the
	// send buffer fills.
	blackhole := []string{"route", "add", "blackhole", clientAddr + "/32"}
	bed.inServer(t, "ip", blackhole...)
	recovering := func() (netip.AddrPort, bool) {
		for _, sf := range bed.subflows(t) {
			if sf.Remote == server && (sf.Local == first || sf.Local == joinKey.local) && sf.Loss.Recovering() {
				return sf.Local, true
			}
		}
		return netip.AddrPort{}, false
	}
	var lossy netip.AddrPort
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var ok bool
		if lossy, ok = recovering(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no subflow is recovering after 5 s without acknowledgements:\n%s", bed.ss(t))
		}
		if err := conn.SetWriteDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(make([]byte, 16<<10)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal(err)
		}
	}
	if err := conn.SetWriteDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	kept := first
	if lossy == first {
		kept = joinKey.local
	}
	// Its connection has nothing elsewhere when both subflows are on
	// the path: left alone.
	if n := p.LeavePath(path, onPath(first, joinKey.local)); n != 0 {
		t.Fatalf("LeavePath closed %d subflows of a connection with none elsewhere, want none", n)
	}
	p.PathBack(path)

	if n := p.LeavePath(path, onPath(lossy)); n != 1 {
		t.Fatalf("LeavePath closed %d subflows, want the recovering one:\n%s", n, bed.ss(t))
	}
	heardOf := func(k subflowKey) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, h := range heard {
			if h == k {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(5 * time.Second); !heardOf(subflowKey{lossy, server}); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the datapath did not hear of the closed subflow within 5 s")
		}
	}
	// No join is opened while the path is down (the replacement's
	// usual wait, 20 ms, long passed).
	bed.inServer(t, "ip", append([]string{"route", "del"}, blackhole[2:]...)...)
	time.Sleep(10 * firstReplaceDelay)
	if got := bed.establishedSubflows(t); len(got) != 1 || got[0] != kept.Port() {
		t.Fatalf("established subflows from ports %v while the path is down, want only the kept one's %d:\n%s", got, kept.Port(), bed.ss(t))
	}
	if st := p.States(); len(st) != 1 || st[0].LeftSubflows != 1 || st[0].ReplacedJoins != 0 {
		t.Errorf("path manager states %+v, want one subflow left and none replaced yet", st)
	}
	// The connection goes on over the kept subflow: what is written is
	// acknowledged at the connection level.
	if _, err := conn.Write(make([]byte, 256<<10)); err != nil {
		t.Fatalf("writing after the subflow was closed: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); unacknowledged(t, conn) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes written are not acknowledged 10 s after the subflow was closed:\n%s", unacknowledged(t, conn), bed.ss(t))
		}
	}

	p.PathBack(path)
	got := bed.waitForSubflows(t, 2)
	if len(got) != 2 {
		t.Fatalf("established subflows from ports %v once the path is back, want the kept one and a new one:\n%s", got, bed.ss(t))
	}
	if st := p.States(); len(st) != 1 || st[0].ReplacedJoins != 1 {
		t.Errorf("path manager states %+v, want one join replaced", st)
	}
	if _, err := conn.Write([]byte("still here")); err != nil {
		t.Fatal(err)
	}
}

// A join the pod's kernel itself closes while its path is down (a reset, a
// checksum failure: here ss -K) is not replaced while the path is down,
// where the datapath would place the replacement on a live path for good,
// but when the path is back, as a subflow LeavePath closed is.
func TestASubflowTheKernelClosesWhileItsPathIsDownIsReplacedWhenItIsBack(t *testing.T) {
	bed := newPMBed(t)
	closed := make(chan subflowKey, 8)
	p := bed.clientPathManager(t, func(k subflowKey) uint32 {
		closed <- k
		return testPath
	})
	conn := bed.dial(t)
	defer conn.Close()
	initial := netip.MustParseAddrPort(conn.LocalAddr().String()).Port()
	join := bed.waitForJoin(t, initial)
	// The path goes down; nothing on it is recovering, so nothing is left.
	if n := p.LeavePath(testPath, func(netip.AddrPort, netip.AddrPort) (bool, bool) { return false, false }); n != 0 {
		t.Fatalf("LeavePath closed %d subflows, want none", n)
	}
	bed.killSubflow(t, join)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the datapath did not hear of the closed join within 5 s")
	}
	time.Sleep(10 * firstReplaceDelay)
	if got := bed.establishedSubflows(t); len(got) != 1 || got[0] != initial {
		t.Fatalf("established subflows from ports %v while the path is down, want only the initial one's %d:\n%s", got, initial, bed.ss(t))
	}
	if st := p.States(); len(st) != 1 || st[0].ReplacedJoins != 0 || st[0].LeftSubflows != 0 {
		t.Errorf("path manager states %+v, want nothing left or replaced yet", st)
	}

	p.PathBack(testPath)
	got := bed.waitForSubflows(t, 2)
	if len(got) != 2 || !slices.Contains(got, initial) || slices.Contains(got, join) {
		t.Fatalf("established subflows from ports %v once the path is back, want the initial one and a new join:\n%s", got, bed.ss(t))
	}
	if st := p.States(); len(st) != 1 || st[0].ReplacedJoins != 1 {
		t.Errorf("path manager states %+v, want one join replaced", st)
	}
	if _, err := conn.Write([]byte("still here")); err != nil {
		t.Fatal(err)
	}
}

// A path manager started while a path is down knows it is (its kernel's
// closes on the path wait for it), until PathBack.
func TestAPathManagerStartedWhileAPathIsDownKnowsIt(t *testing.T) {
	bed := newPMBed(t)
	p := NewPathManagers(slog.New(slog.DiscardHandler), PathManagerOptions{})
	t.Cleanup(p.Stop)
	p.PathDown(testPath)
	if errs := p.Sync(context.Background(), []Want{{Pod: bed.client, Joins: 1}}); errs != nil {
		t.Fatal(errs)
	}
	pms := slices.Collect(maps.Values(p.m))
	if len(pms) != 1 || !pms[0].isDown(testPath) || pms[0].isDown(testPath+1) {
		t.Fatalf("a path manager started while path %d is down: %d of them, down %v", testPath, len(pms), len(pms) == 1 && pms[0].isDown(testPath))
	}
	p.PathBack(testPath)
	if pms[0].isDown(testPath) || p.Down(testPath) {
		t.Error("the path is still down after PathBack")
	}
}

// The replacements a path manager holds for one path are bounded; past the
// bound they are opened at once.
func TestReplacementsHeldForAPathAreBounded(t *testing.T) {
	s := &pathManager{}
	s.markDown(testPath)
	remote := netip.MustParseAddrPort(serverAddr + ":5201")
	ev := func(token uint32) mptcpnl.Event {
		return mptcpnl.Event{Type: mptcpnl.EventSubClosed, Token: token, Local: netip.MustParseAddrPort(clientAddr + ":40000"), Remote: remote}
	}
	for token := range uint32(maxAwaitingPerPath) {
		if !s.awaitPath(testPath, ev(token), remote) {
			t.Fatalf("replacement %d not held, want the first %d held", token+1, maxAwaitingPerPath)
		}
	}
	if s.awaitPath(testPath, ev(maxAwaitingPerPath), remote) {
		t.Errorf("replacement %d held, want it opened at once", maxAwaitingPerPath+1)
	}
	if s.awaitPath(testPath+1, ev(1), remote) {
		t.Error("a replacement for a path that is up held")
	}
}

// toLeave picks the subflows on the path that recover from losses, from
// the pod's address, of connections the path manager would replace them
// in and that keep one on a live path.
func TestToLeavePicksRecoveringSubflowsOfConnectionsThatKeepAnother(t *testing.T) {
	s := &pathManager{pod: Pod{IPs: []netip.Addr{netip.MustParseAddr(clientAddr)}}, opened: openedConns{}}
	remote := netip.MustParseAddrPort(serverAddr + ":5201")
	sf := func(token uint32, port uint16, flags mptcpnl.SubflowFlags, loss mptcpnl.TCPLoss) mptcpnl.Subflow {
		return mptcpnl.Subflow{Local: netip.AddrPortFrom(netip.MustParseAddr(clientAddr), port), Remote: remote, Token: token, Flags: flags, Loss: loss}
	}
	lossy := mptcpnl.TCPLoss{CAState: 4, Backoff: 2, Retrans: 1}
	sfs := []mptcpnl.Subflow{
		sf(1, 1000, mptcpnl.SubflowCapableLocal, lossy), // on the path, recovering: closed
		sf(1, 1001, mptcpnl.SubflowJoinLocal, mptcpnl.TCPLoss{}),
		sf(2, 2000, mptcpnl.SubflowCapableLocal, mptcpnl.TCPLoss{}), // on the path, healthy
		sf(2, 2001, mptcpnl.SubflowJoinLocal, mptcpnl.TCPLoss{}),
		sf(3, 3000, 0, lossy), // a connection the peer opened
		sf(3, 3001, 0, mptcpnl.TCPLoss{}),
		sf(4, 4000, mptcpnl.SubflowCapableLocal, lossy),                 // nothing elsewhere
		sf(5, 5001, mptcpnl.SubflowJoinLocal, mptcpnl.TCPLoss{Lost: 3}), // a join recovering; its first subflow closed earlier
		sf(5, 5002, mptcpnl.SubflowJoinLocal, mptcpnl.TCPLoss{}),
		sf(6, 6000, mptcpnl.SubflowCapableLocal, lossy), // its other subflow is on a path down too
		sf(6, 6001, mptcpnl.SubflowJoinLocal, mptcpnl.TCPLoss{}),
		sf(7, 7000, mptcpnl.SubflowCapableLocal, mptcpnl.TCPLoss{Backoff: 3}), // zero-window probes back off: no loss
		sf(7, 7001, mptcpnl.SubflowJoinLocal, mptcpnl.TCPLoss{}),
		sf(8, 8000, mptcpnl.SubflowCapableLocal, lossy), // a connection the path manager does not remember
		sf(8, 8001, mptcpnl.SubflowJoinLocal, mptcpnl.TCPLoss{}),
	}
	// The path manager remembers the connections the pod opened with
	// their subflows: not 3 (the peer opened it), nor 8 (opened before
	// the agent started, say).
	for _, f := range sfs {
		if f.Token == 3 || f.Token == 8 {
			continue
		}
		if s.opened[f.Token] == nil {
			s.opened[f.Token] = &openedConn{remote: remote, live: map[subflowKey]bool{}}
		}
		s.opened[f.Token].live[subflowKey{f.Local, f.Remote}] = true
	}
	on := map[uint16]bool{1000: true, 2000: true, 3000: true, 4000: true, 5001: true, 6000: true, 7000: true, 8000: true}
	got := s.toLeave(sfs, func(local, _ netip.AddrPort) (bool, bool) {
		return on[local.Port()], !on[local.Port()] && local.Port() != 6001
	})
	var ports []string
	for _, g := range got {
		ports = append(ports, fmt.Sprint(g.Local.Port()))
	}
	if strings.Join(ports, ",") != "1000,5001" {
		t.Errorf("toLeave picked ports %v, want 1000 and 5001", ports)
	}
}

// establishedSubflows are the source ports of the client's established
// subflows to the server.
func (b *pmBed) establishedSubflows(t *testing.T) []uint16 {
	t.Helper()
	var ports []uint16
	for _, sf := range b.subflows(t) {
		ports = append(ports, sf.Local.Port())
	}
	return ports
}

// subflows lists the client pod's MPTCP subflows.
func (b *pmBed) subflows(t *testing.T) []mptcpnl.Subflow {
	t.Helper()
	fd, err := netnsutil.Open(b.client.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	sfs, err := mptcpnl.ListSubflows(fd)
	if err != nil {
		t.Fatal(err)
	}
	return sfs
}

// unacknowledged is how many bytes written to conn its peer has not
// acknowledged yet (SIOCOUTQ: for MPTCP, at the connection level).
func unacknowledged(t *testing.T, conn net.Conn) int {
	t.Helper()
	raw, err := conn.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ioctlErr error
	if err := raw.Control(func(fd uintptr) { n, ioctlErr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil {
		t.Fatal(err)
	}
	if ioctlErr != nil {
		t.Fatalf("SIOCOUTQ: %v", ioctlErr)
	}
	return n
}
