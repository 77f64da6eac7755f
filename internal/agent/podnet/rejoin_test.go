package podnet

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/test/testutil/bpfutil"
)

// A join the pod's kernel closes while its connection lives (here killed
// with ss -K, as a reset would close it) is reported to the datapath with
// its 4-tuple and replaced by a new join, which the connection then has;
// the replacement is counted.
func TestAClosedJoinIsReplaced(t *testing.T) {
	bed := newPMBed(t)
	closed := make(chan subflowKey, 8)
	p := bed.clientPathManager(t, func(k subflowKey) uint32 {
		closed <- k
		return testPath // up: the replacement is opened at once
	})
	conn := bed.dial(t)
	defer conn.Close()
	initial := netip.MustParseAddrPort(conn.LocalAddr().String()).Port()
	first := bed.waitForJoin(t, initial)

	bed.killSubflow(t, first)
	select {
	case k := <-closed:
		want := subflowKey{netip.AddrPortFrom(netip.MustParseAddr(clientAddr), first), netip.MustParseAddrPort(serverAddr + ":5201")}
		if k != want {
			t.Errorf("the datapath heard of %v -> %v closing, want %v -> %v", k.local, k.remote, want.local, want.remote)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the datapath did not hear of the closed join within 5 s")
	}
	var second uint16
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if second = bed.establishedJoin(t, initial); second != 0 && second != first {
			break
		}
	}
	if second == 0 || second == first {
		t.Fatalf("no join replaced the closed one within 5 s:\n%s", bed.ss(t))
	}
	if info, err := mptcpnl.SocketInfo(conn.(*net.TCPConn)); err != nil || info.Subflows != 1 {
		t.Errorf("the connection has %d joins (%v), want 1 again", info.Subflows, err)
	}
	if st := p.States(); len(st) != 1 || st[0].ReplacedJoins != 1 {
		t.Errorf("path manager states %+v, want one join replaced", st)
	}
	// The connection still carries data.
	if _, err := conn.Write([]byte("still here")); err != nil {
		t.Fatal(err)
	}
}

// Joins are replaced only for established subflows of connections the pod
// opened, or for a replacement that failed to establish (after twice the
// wait), and at most maxReplacedJoins times per connection.
func TestReplacedJoinsAreBounded(t *testing.T) {
	local := netip.MustParseAddrPort("192.0.2.1:40000")
	remote := netip.MustParseAddrPort("192.0.2.2:5201")
	conns := openedConns{}
	ev := func(typ mptcpnl.EventType, token uint32, sport uint16) mptcpnl.Event {
		return mptcpnl.Event{Type: typ, Token: token, Local: netip.AddrPortFrom(local.Addr(), sport), Remote: remote}
	}
	closed := func(token uint32, sport uint16) (time.Duration, bool) {
		return conns.subflowClosed(ev(mptcpnl.EventSubClosed, token, sport))
	}
	conns.established(ev(mptcpnl.EventEstablished, 1, local.Port()))
	if _, ok := closed(1, 40001); ok {
		t.Error("a join that never established is replaced")
	}
	if _, ok := closed(2, 40001); ok {
		t.Error("a subflow of a connection the pod did not open is replaced")
	}
	// An established join closes: replaced after the first wait.
	conns.subflowEstablished(ev(mptcpnl.EventSubEstablished, 1, 41000))
	if d, ok := closed(1, 41000); !ok || d != firstReplaceDelay {
		t.Fatalf("closed join: replace %v after %v, want after %v", ok, d, firstReplaceDelay)
	}
	// Its replacement is refused (closes unestablished): tried again
	// after twice the wait; then it establishes, and the wait is reset.
	if d, ok := closed(1, 41001); !ok || d != 2*firstReplaceDelay {
		t.Fatalf("failed replacement: again %v after %v, want after %v", ok, d, 2*firstReplaceDelay)
	}
	conns.subflowEstablished(ev(mptcpnl.EventSubEstablished, 1, 41002))
	if _, ok := closed(1, 41003); ok {
		t.Error("a join that never established is replaced with no replacement pending")
	}
	// Established joins closing, until the bound.
	for sport := uint16(43000); ; sport++ {
		conns.subflowEstablished(ev(mptcpnl.EventSubEstablished, 1, sport))
		if _, ok := closed(1, sport); !ok {
			break
		}
		conns.subflowEstablished(ev(mptcpnl.EventSubEstablished, 1, sport+1000))
	}
	if c := conns[1]; c.replaced != maxReplacedJoins {
		t.Errorf("%d replacements opened, want the bound %d", c.replaced, maxReplacedJoins)
	}
}

// establishedJoin returns the source port of an established subflow of the
// client to the server other than the initial one's, 0 if none.
func (b *pmBed) establishedJoin(t *testing.T, initial uint16) uint16 {
	t.Helper()
	for _, line := range strings.Split(b.ss(t), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[0] != "ESTAB" || f[4] != serverAddr+":5201" {
			continue
		}
		if ap, err := netip.ParseAddrPort(f[3]); err == nil && ap.Port() != initial {
			return ap.Port()
		}
	}
	return 0
}

// waitForJoin waits up to 5 s for an established join of the connection
// whose initial subflow is from port initial, and returns its port.
func (b *pmBed) waitForJoin(t *testing.T, initial uint16) uint16 {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if port := b.establishedJoin(t, initial); port != 0 {
			return port
		}
	}
	t.Fatalf("the connection has no established join after 5 s:\n%s", b.ss(t))
	return 0
}

// waitForSubflows waits up to 5 s for the client pod to have n established
// subflows and returns their ports as last listed.
func (b *pmBed) waitForSubflows(t *testing.T, n int) []uint16 {
	t.Helper()
	var got []uint16
	for deadline := time.Now().Add(5 * time.Second); len(got) != n && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got = b.establishedSubflows(t)
	}
	return got
}

// ss lists the client's TCP sockets (subflows included).
func (b *pmBed) ss(t *testing.T) string {
	t.Helper()
	return b.clientSS(t, "-tnH")
}

// clientSS runs ss with args in the client pod's namespace.
func (b *pmBed) clientSS(t *testing.T, args ...string) string {
	t.Helper()
	return inNetNS(t, "mptpm-c-"+b.id, "ss", args...)
}

// killSubflow closes the client's established subflow from port sport, as
// a reset would (ss -K).
func (b *pmBed) killSubflow(t *testing.T, sport uint16) {
	t.Helper()
	b.clientSS(t, "-K", "-t", "state", "established", fmt.Sprintf("( sport = :%d )", sport))
}

// inServer runs a command in the server's namespace.
func (b *pmBed) inServer(t *testing.T, name string, args ...string) {
	t.Helper()
	inNetNS(t, "mptpm-s-"+b.id, name, args...)
}

// testPath is the path the tests' stand-in datapath has the subflows on.
const testPath = 1

// clientPathManager starts path managers that open one join per connection
// of the bed's client pod and hand every subflow the pod closes to closed,
// as the datapath hears of them; closed returns the subflow's path.
func (b *pmBed) clientPathManager(t *testing.T, closed func(subflowKey) uint32) *PathManagers {
	t.Helper()
	p := NewPathManagers(slog.New(slog.DiscardHandler), PathManagerOptions{SubflowClosed: func(local, remote netip.AddrPort, _ uint32, _ time.Time) (uint32, error) {
		return closed(subflowKey{local, remote}), nil
	}})
	t.Cleanup(p.Stop)
	if errs := p.Sync(context.Background(), []Want{{Pod: b.client, Joins: 1}}); errs != nil {
		t.Fatal(errs)
	}
	return p
}

func inNetNS(t *testing.T, ns, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return string(out)
}

// Only events about the pod's own addresses are acted on: the datapath
// entries of another address are not the pod's to give back.
func TestOnlyThePodsOwnAddressesAreActedOn(t *testing.T) {
	pm := &pathManager{pod: Pod{IPs: []netip.Addr{netip.MustParseAddr(clientAddr)}}}
	for addr, want := range map[string]bool{clientAddr: true, "::ffff:" + clientAddr: true, serverAddr: false, "2001:db8::1": false} {
		if got := pm.owns(netip.MustParseAddr(addr)); got != want {
			t.Errorf("owns(%s) = %v, want %v", addr, got, want)
		}
	}
}

// A join the path manager opens is a backup subflow until it has been
// established for the holdoff: the connection's data goes over its initial
// subflow meanwhile, and over both after. With no holdoff the join carries
// data at once, which shows that the bed would let it.
func TestJoinsAreHeldAsBackupForTheHoldoff(t *testing.T) {
	const holdoff = 1500 * time.Millisecond
	for _, tc := range []struct {
		name    string
		holdoff time.Duration
	}{{"held", holdoff}, {"not held", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			bed := newPMBed(t)
			p := NewPathManagers(slog.New(slog.DiscardHandler), PathManagerOptions{JoinHoldoff: tc.holdoff})
			t.Cleanup(p.Stop)
			if errs := p.Sync(context.Background(), []Want{{Pod: bed.client, Joins: 1}}); errs != nil {
				t.Fatal(errs)
			}
			join, established := bed.sendOnAJoin(t)

			time.Sleep(holdoff / 2)
			during := bed.bytesAcked(t, join)
			if held := tc.holdoff > 0; held != (during < 64<<10) {
				t.Errorf("half the holdoff after it was established the join had carried %d bytes; held %v", during, held)
			}
			if st := p.States(); len(st) != 1 || st[0].ReleasedJoins != 0 {
				t.Errorf("path manager states %+v during the hold, want no join released yet", st)
			}

			time.Sleep(time.Until(established.Add(holdoff + 500*time.Millisecond)))
			after := bed.bytesAcked(t, join)
			t.Logf("the join carried %d bytes in the first half of the holdoff, %d bytes more by 0.5 s after it", during, after-during)
			if after-during < 1<<20 {
				t.Errorf("after the holdoff the join carried %d bytes more, want it active (at least 1 MiB)", after-during)
			}
			released := uint64(0)
			if tc.holdoff > 0 {
				released = 1
			}
			if st := p.States(); len(st) != 1 || st[0].ReleasedJoins != released {
				t.Errorf("path manager states %+v after the hold, want %d join released", st, released)
			}
		})
	}
}

// A held join whose acceptor has not answered its handshake (its answer to
// the third ACK is dropped on the way) stays held past the holdoff: the
// acceptor may not have taken it in, and data on it could land in the wrong
// place (the kernel refuses to make it active meanwhile, but would take the
// MP_PRIO as soon as the answer arrives). Once the answers get through it is
// released a holdoff after a sweep first sees it answered.
func TestAHeldJoinIsReleasedOnlyOnceItsAcceptorAnswered(t *testing.T) {
	const holdoff = 300 * time.Millisecond
	bed := newPMBed(t)
	filter := bpfutil.DropJoinAnswers(t, bed.client.NetNS, "eth0", 5201)
	p := NewPathManagers(slog.New(slog.DiscardHandler), PathManagerOptions{JoinHoldoff: holdoff})
	t.Cleanup(p.Stop)
	if errs := p.Sync(context.Background(), []Want{{Pod: bed.client, Joins: 1}}); errs != nil {
		t.Fatal(errs)
	}
	conn := bed.connect(t)
	initial := netip.MustParseAddrPort(conn.LocalAddr().String()).Port()
	filter.Keep(t, initial)
	// The first data makes the connection fully established: then the
	// path manager opens the join.
	if _, err := conn.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	join := bed.waitForJoin(t, initial)
	flags := func() mptcpnl.SubflowFlags {
		t.Helper()
		sfs := bed.subflows(t)
		for _, sf := range sfs {
			if sf.Local.Port() == join {
				return sf.Flags
			}
		}
		t.Fatalf("the join from port %d is not listed: %+v", join, sfs)
		return 0
	}

	time.Sleep(3 * holdoff)
	f := flags()
	if f&mptcpnl.SubflowFullyEstablished != 0 || filter.Dropped(t) == 0 {
		t.Fatalf("join flags %#x, %d segments dropped: the filter did not keep the acceptor's answer away",
			f, filter.Dropped(t))
	}
	if f&mptcpnl.SubflowBackupLocal == 0 {
		t.Errorf("three holdoffs after it was established, the unanswered join is active (flags %#x), want it held", f)
	}
	if st := p.States(); len(st) != 1 || st[0].ReleasedJoins != 0 {
		t.Errorf("path manager states %+v, want no join released while its acceptor has not answered", st)
	}

	// The answers get through from now on: the join may be released a
	// holdoff after a sweep first sees it answered, not before.
	answerable := time.Now()
	filter.Remove()
	deadline := time.Now().Add(10 * time.Second)
	for flags()&mptcpnl.SubflowBackupLocal != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the join is still held 10 s after its acceptor's answers got through (flags %#x):\n%s",
				flags(), bed.clientSS(t, "-tniMH"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if after := time.Since(answerable); after < holdoff {
		t.Errorf("the join was released %v after its acceptor could answer, want a holdoff (%v) after it was seen answered",
			after, holdoff)
	}
	if f := flags(); f&mptcpnl.SubflowFullyEstablished == 0 {
		t.Errorf("the join was released before its acceptor answered (flags %#x)", f)
	}
	if st := p.States(); len(st) != 1 || st[0].ReleasedJoins != 1 {
		t.Errorf("path manager states %+v, want the join released", st)
	}
}

// sendOnAJoin opens a connection from the client that sends until the test
// ends, and returns the source port of its first join and when it saw it
// established.
func (b *pmBed) sendOnAJoin(t *testing.T) (join uint16, established time.Time) {
	t.Helper()
	conn := b.dial(t)
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 256<<10)
		for {
			if _, err := conn.Write(buf); err != nil {
				return
			}
		}
	}()
	initial := netip.MustParseAddrPort(conn.LocalAddr().String()).Port()
	for deadline := time.Now().Add(5 * time.Second); join == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		join = b.establishedJoin(t, initial)
	}
	if join == 0 {
		t.Fatalf("the connection has no established join after 5 s:\n%s", b.ss(t))
	}
	return join, time.Now()
}

// A held join whose release was lost is made active by the sweeps of the
// next path manager or session: the second that finds it held, a holdoff
// after the first: the agent was restarted during the hold (its path managers
// stopped, new ones started), or the session that scheduled the release
// failed. Without a path manager the join stays held: that is what the
// sweep is for.
func TestAHeldJoinWhoseReleaseWasLostIsMadeActiveByASweep(t *testing.T) {
	const holdoff = 1500 * time.Millisecond
	start := func(t *testing.T, bed *pmBed) *PathManagers {
		p := NewPathManagers(slog.New(slog.DiscardHandler), PathManagerOptions{JoinHoldoff: holdoff})
		t.Cleanup(p.Stop)
		if errs := p.Sync(context.Background(), []Want{{Pod: bed.client, Joins: 1}}); errs != nil {
			t.Fatal(errs)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		// lose loses the release of the join established at
		// established, and returns the path managers that run then.
		lose func(t *testing.T, bed *pmBed, p *PathManagers, join uint16, established time.Time) *PathManagers
	}{
		{"agent restarted", func(t *testing.T, bed *pmBed, p *PathManagers, join uint16, established time.Time) *PathManagers {
			p.Stop()
			time.Sleep(time.Until(established.Add(holdoff + 500*time.Millisecond)))
			if n := bed.bytesAcked(t, join); n >= 64<<10 {
				t.Fatalf("with no path manager the join carried %d bytes after its holdoff, want it held", n)
			}
			return start(t, bed)
		}},
		{"session failed", func(t *testing.T, bed *pmBed, p *PathManagers, _ uint16, _ time.Time) *PathManagers {
			p.get(bed.client).current.Load().events.Close()
			return p
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bed := newPMBed(t)
			p := start(t, bed)
			join, established := bed.sendOnAJoin(t)
			p = tc.lose(t, bed, p, join, established)
			lost := time.Now()
			before := bed.bytesAcked(t, join)

			// A first sweep a holdoff after the loss sees the join
			// held and leaves it so: its event may still be queued,
			// and sock_diag does not say how long ago it began. The
			// next, a holdoff later, releases it.
			time.Sleep(time.Until(lost.Add(holdoff + 500*time.Millisecond)))
			if n := bed.bytesAcked(t, join); n-before >= 64<<10 {
				t.Errorf("the join carried %d bytes by the first sweep, want it held until the second", n-before)
			}
			const within = 2*holdoff + time.Second
			time.Sleep(time.Until(lost.Add(within)))
			after := bed.bytesAcked(t, join)
			t.Logf("the join carried %d bytes before its release was lost, %d bytes in the %v after", before, after-before, within)
			if after-before < 1<<20 {
				t.Errorf("the join carried %d bytes in the %v after its release was lost, want it active (at least 1 MiB)", after-before, within)
			}
			if st := p.States(); len(st) != 1 || st[0].ReleasedJoins != 1 {
				t.Errorf("path manager states %+v, want the held join released by a sweep", st)
			}
		})
	}
}

// bytesAcked is how many bytes of data the client's subflow from port has
// had acknowledged (ss -ti; the SYN's is not counted).
func (b *pmBed) bytesAcked(t *testing.T, port uint16) uint64 {
	t.Helper()
	out := b.clientSS(t, "-tniH", "state", "established", fmt.Sprintf("( sport = :%d )", port))
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, "bytes_acked:"); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("ss: %q: %v", f, err)
			}
			return n - 1
		}
	}
	// ss leaves bytes_acked out while it is still the SYN's 1.
	return 0
}

// Only the path manager's own held joins are made active: a subflow from
// another local id (one a process of the pod opened itself), to another
// remote, from another address, or of a connection it does not remember is
// left alone; and nothing is released without a holdoff.
func TestOnlyThePathManagersOwnHeldJoinsAreReleased(t *testing.T) {
	local := netip.MustParseAddrPort(clientAddr + ":40000")
	remote := netip.MustParseAddrPort(serverAddr + ":5201")
	pm := &pathManager{pod: Pod{IPs: []netip.Addr{local.Addr()}}, holdoff: time.Second, opened: openedConns{}}
	// The session has ended: what releaseLater schedules is dropped.
	sess := &session{ended: make(chan struct{})}
	close(sess.ended)
	pm.opened.established(mptcpnl.Event{Token: 1, Local: local, Remote: remote})
	sub := func(token uint32, from netip.Addr, id uint8, to netip.AddrPort) mptcpnl.Event {
		return mptcpnl.Event{Type: mptcpnl.EventSubEstablished, Token: token, Local: netip.AddrPortFrom(from, 41000), LocalID: id, Remote: to}
	}
	for name, ev := range map[string]mptcpnl.Event{
		"another local id":         sub(1, local.Addr(), 2, remote),
		"another remote":           sub(1, local.Addr(), joinLocalID, netip.MustParseAddrPort(serverAddr+":5202")),
		"another address":          sub(1, netip.MustParseAddr("192.0.2.9"), joinLocalID, remote),
		"a connection not its own": sub(2, local.Addr(), joinLocalID, remote),
	} {
		if pm.releaseLater(sess, ev) {
			t.Errorf("a subflow from %s is released", name)
		}
	}
	own := sub(1, local.Addr(), joinLocalID, remote)
	if !pm.releaseLater(sess, own) {
		t.Error("the path manager's own join is not released")
	}
	pm.holdoff = 0
	if pm.releaseLater(sess, own) {
		t.Error("a join is released without a holdoff, which opens joins active")
	}
	sess.scheduled.Wait()
}

// A sweep takes for the path manager's own held joins what openJoins opens
// held, as the pod's kernel lists them, and nothing else.
func TestASweepFindsOnlyThePathManagersOwnHeldJoins(t *testing.T) {
	local := netip.MustParseAddrPort(clientAddr + ":40000")
	remote := netip.MustParseAddrPort(serverAddr + ":5201")
	pm := &pathManager{pod: Pod{IPs: []netip.Addr{local.Addr()}}}
	const held = mptcpnl.SubflowJoinLocal | mptcpnl.SubflowBackupLocal
	join := func(token uint32, from netip.Addr, id uint8, to netip.AddrPort, flags mptcpnl.SubflowFlags) mptcpnl.Subflow {
		return mptcpnl.Subflow{Token: token, Local: netip.AddrPortFrom(from, 41000+uint16(id)), LocalID: id, Remote: to, Flags: flags}
	}
	own := join(1, local.Addr(), joinLocalID, remote, held)
	sfs := []mptcpnl.Subflow{
		{Token: 1, Local: local, Remote: remote, Flags: mptcpnl.SubflowCapableLocal},
		own,
		join(1, local.Addr(), joinLocalID, remote, mptcpnl.SubflowJoinLocal),                              // active already
		join(1, local.Addr(), 2, remote, held),                                                            // another local id
		join(1, local.Addr(), joinLocalID, netip.MustParseAddrPort(serverAddr+":5202"), held),             // another remote
		join(1, netip.MustParseAddr("192.0.2.9"), joinLocalID, remote, held),                              // another address
		join(2, local.Addr(), joinLocalID, remote, held),                                                  // a connection the pod did not open
		{Token: 3, Local: local, Remote: remote, LocalID: joinLocalID, Flags: mptcpnl.SubflowBackupLocal}, // accepted, not opened here
	}
	if got := pm.heldJoins(sfs); len(got) != 1 || got[0] != own {
		t.Errorf("held joins %+v, want only %+v", got, own)
	}
}
