package mptcpnl

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// pair creates two namespaces joined by a veth: client 192.0.2.1, server 192.0.2.2.
func pair(t *testing.T) (clientNS, serverNS string) {
	t.Helper()
	return testutil.NetNSPair(t, "mptnl-")
}

func dialIn(t *testing.T, ns string) *Conn {
	t.Helper()
	fd, err := netnsutil.Open("/var/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Dial(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestLimitsRoundTrip(t *testing.T) {
	clientNS, _ := pair(t)
	c := dialIn(t, clientNS)
	want := Limits{Subflows: 3, AddAddrAccepted: 2}
	if err := c.SetLimits(want); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetLimits()
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("limits = %+v, want %+v", got, want)
	}
}

// Endpoints read back as they were added, port, flags and interface
// included, and a flush leaves none.
func TestEndpointsRoundTrip(t *testing.T) {
	clientNS, _ := pair(t)
	c := dialIn(t, clientNS)
	want := []Endpoint{
		{Addr: netip.MustParseAddr("192.0.2.1"), ID: 1, Flags: FlagSubflow},
		{Addr: netip.MustParseAddr("192.0.2.1"), ID: 2, Port: 6002, Flags: FlagSignal},
		{Addr: netip.MustParseAddr("192.0.2.3"), ID: 3, Flags: FlagSubflow | FlagBackup, IfIndex: 1},
	}
	for _, e := range want {
		if err := c.AddEndpoint(e); err != nil {
			t.Fatalf("adding %+v: %v", e, err)
		}
	}
	got, err := c.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("endpoints = %+v, want %+v", got, want)
	}
	if err := c.FlushEndpoints(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Endpoints(); err != nil || len(got) != 0 {
		t.Fatalf("after the flush: %+v (%v), want none", got, err)
	}
}

// The endpoint flags are the kernel's, as iproute2 names them: an
// endpoint added with each flag shows that flag's name and no other.
func TestEndpointFlagsAreTheKernels(t *testing.T) {
	clientNS, _ := pair(t)
	c := dialIn(t, clientNS)
	for id, f := range []struct {
		flag uint32
		name string
	}{{FlagSignal, "signal"}, {FlagSubflow, "subflow"}, {FlagBackup, "backup"}, {FlagSubflow | FlagFullmesh, "fullmesh"}} {
		e := Endpoint{Addr: netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + id)}), ID: uint8(id + 1), Flags: f.flag}
		if err := c.AddEndpoint(e); err != nil {
			t.Fatalf("adding %+v: %v", e, err)
		}
		out, err := exec.Command("ip", "-n", clientNS, "mptcp", "endpoint", "show", "id", fmt.Sprint(e.ID)).CombinedOutput()
		if err != nil {
			t.Fatalf("ip mptcp endpoint show: %v: %s", err, out)
		}
		if !strings.Contains(string(out), " "+f.name+" ") || strings.Contains(string(out), "implicit") {
			t.Errorf("endpoint added with flags %#x (%s) shows as %q", f.flag, f.name, out)
		}
	}
}

// userspaceConn is an MPTCP connection from clientNS, whose path manager is
// userspace, to a server in serverNS that accepts 3 joins and reads what
// it is sent until the end (its byte count comes on read). events
// receives the client namespace's path-manager events, past the
// connection's ESTABLISHED one; cmds sends commands there.
type userspaceConn struct {
	clientNS     string
	conn         net.Conn
	established  Event
	events, cmds *Conn
	read         chan int64
}

func dialUserspace(t *testing.T) *userspaceConn {
	t.Helper()
	clientNS, serverNS := pair(t)
	if err := netnsutil.WriteSysctl("/var/run/netns/"+clientNS, "net.mptcp.path_manager", "userspace"); err != nil {
		t.Fatal(err)
	}
	server := dialIn(t, serverNS)
	if err := server.SetLimits(Limits{Subflows: 3}); err != nil {
		t.Fatal(err)
	}
	u := &userspaceConn{clientNS: clientNS, events: dialIn(t, clientNS), cmds: dialIn(t, clientNS), read: make(chan int64, 1)}
	if err := u.events.SubscribeEvents(); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := netnsutil.Do("/var/run/netns/"+serverNS, func() error {
		lc := net.ListenConfig{}
		lc.SetMultipathTCP(true)
		var err error
		ln, err = lc.Listen(context.Background(), "tcp", "192.0.2.2:5201")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			u.read <- -1
			return
		}
		n, _ := io.Copy(io.Discard, c)
		c.Close()
		u.read <- n
	}()
	if err := netnsutil.Do("/var/run/netns/"+clientNS, func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(true)
		var err error
		u.conn, err = d.Dial("tcp", "192.0.2.2:5201")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.conn.Close() })
	// A v1 client is fully established (and may join) once the server has
	// acknowledged data at the MPTCP level: send some, as any client would.
	if _, err := u.conn.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	ev, ok := u.next(t, EventEstablished)
	if !ok {
		t.Fatal("no ESTABLISHED event for the client connection")
	}
	if ev.ServerSide {
		t.Fatalf("client-side connection reported as server side: %+v", ev)
	}
	if ev.Local != u.conn.LocalAddr().(*net.TCPAddr).AddrPort() {
		t.Fatalf("event for %v, want the dialled connection %v", ev.Local, u.conn.LocalAddr())
	}
	u.established = ev
	return u
}

// next waits up to 5 s for the next event of type typ, skipping others.
func (u *userspaceConn) next(t *testing.T, typ EventType) (Event, bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		evs, err := u.events.Receive()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Type == typ {
				return ev, true
			}
		}
	}
	return Event{}, false
}

// subflows waits up to 5 s for the client kernel to report want joins, and
// returns how many it reports.
func (u *userspaceConn) joins(t *testing.T, want int) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		info, err := SocketInfo(u.conn.(*net.TCPConn))
		if err != nil {
			t.Fatal(err)
		}
		if int(info.Subflows) == want || time.Now().After(deadline) {
			return int(info.Subflows)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// listed lists the client namespace's subflows.
func (u *userspaceConn) listed(t *testing.T) []Subflow {
	t.Helper()
	fd, err := netnsutil.Open("/var/run/netns/" + u.clientNS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	sfs, err := ListSubflows(fd)
	if err != nil {
		t.Fatal(err)
	}
	return sfs
}

// As a userspace path manager, the agent opens joins from the connection's
// own address to the same server address and port; the kernel picks each
// join's source port, so nothing but the token ties them together.
func TestUserspacePathManagerCreatesJoinsFromSameAddress(t *testing.T) {
	u := dialUserspace(t)
	// The initial subflow's address has id 0; joins from the same address
	// are given a non-zero local id.
	// The last is opened as a backup subflow.
	for i := 0; i < 3; i++ {
		var flags uint32
		if i == 2 {
			flags = FlagBackup
		}
		if err := u.cmds.CreateSubflow(u.established.Token, u.established.Local.Addr(), 1, u.established.Remote, flags); err != nil {
			t.Fatalf("create subflow %d: %v", i, err)
		}
	}
	// The namespace has one address, so three open joins to the same server
	// address and port can differ only by their kernel-chosen source ports.
	if n := u.joins(t, 3); n != 3 {
		t.Fatalf("client kernel reports %d joins, want 3", n)
	}
	requireSubflowsListed(t, u.listed(t), u.established)
}

// A subflow the path manager destroys, the connection's first one
// included, is reported closed, and the connection goes on over its other
// subflow, delivering every byte; a join opened afterwards from the same
// address (as the agent opens one when the subflow's path is back) is
// taken. A healthy subflow is listed as not recovering from losses.
func TestDestroyedSubflowIsReportedAndItsConnectionGoesOn(t *testing.T) {
	u := dialUserspace(t)
	tok, local, remote := u.established.Token, u.established.Local, u.established.Remote
	if err := u.cmds.CreateSubflow(tok, local.Addr(), 1, remote, 0); err != nil {
		t.Fatal(err)
	}
	if _, ok := u.next(t, EventSubEstablished); !ok {
		t.Fatal("the join was not established")
	}
	for _, sf := range u.listed(t) {
		if sf.Loss.Recovering() {
			t.Errorf("subflow %v of an idle connection on a clean link is listed recovering: %+v", sf.Local, sf.Loss)
		}
	}
	if err := u.cmds.DestroySubflow(tok, local, remote); err != nil {
		t.Fatalf("destroying the first subflow: %v", err)
	}
	closed, ok := u.next(t, EventSubClosed)
	if !ok || closed.Local != local || closed.Remote != remote {
		t.Fatalf("closed event %+v (%v), want the first subflow %v -> %v", closed, ok, local, remote)
	}
	for _, sf := range u.listed(t) {
		if sf.Local == local {
			t.Fatalf("the destroyed first subflow is still listed: %+v", sf)
		}
	}
	// The connection sends on; then a join replaces the closed subflow.
	payload := make([]byte, 1<<20)
	if _, err := u.conn.Write(payload); err != nil {
		t.Fatalf("writing after the destroy: %v", err)
	}
	if err := u.cmds.CreateSubflow(tok, local.Addr(), 1, remote, 0); err != nil {
		t.Fatalf("opening a join after the destroy: %v", err)
	}
	if n := u.joins(t, 2); n != 2 {
		t.Fatalf("client kernel reports %d joins after a new one, want 2", n)
	}
	if _, err := u.conn.Write(payload); err != nil {
		t.Fatalf("writing after the new join: %v", err)
	}
	u.conn.Close()
	if got, want := <-u.read, int64(len("hello")+2*len(payload)); got != want {
		t.Fatalf("server read %d bytes, want %d", got, want)
	}
}

// requireSubflowsListed checks what ListSubflows said (sfs) of the connection of
// established: its first subflow opened here with MP_CAPABLE, and three
// joins from local id 1, the last of them a backup.
func requireSubflowsListed(t *testing.T, sfs []Subflow, established Event) {
	t.Helper()
	var joins, backups int
	for _, sf := range sfs {
		if sf.Token != established.Token || sf.Remote != established.Remote {
			t.Errorf("subflow %+v: want token %x and remote %v", sf, established.Token, established.Remote)
			continue
		}
		switch {
		case sf.Local == established.Local:
			if sf.Flags&SubflowCapableLocal == 0 || sf.Flags&SubflowJoinLocal != 0 || sf.LocalID != 0 {
				t.Errorf("first subflow %+v: want MP_CAPABLE sent here, local id 0", sf)
			}
		case sf.Flags&SubflowJoinLocal != 0 && sf.LocalID == 1:
			joins++
			if sf.Flags&SubflowBackupLocal != 0 {
				backups++
			}
		default:
			t.Errorf("subflow %+v: neither the first nor a join from local id 1", sf)
		}
	}
	if joins != 3 || backups != 1 {
		t.Errorf("listed %d joins, %d of them backup, want 3 and 1: %+v", joins, backups, sfs)
	}
}

// A listed subflow says how many bytes it carried, both ways: what a path
// manager that holds a connection's joins back until it has carried enough
// reads.
func TestListedSubflowsSayWhatTheyCarried(t *testing.T) {
	u := dialUserspace(t)
	payload := make([]byte, 64<<10)
	if _, err := u.conn.Write(payload); err != nil {
		t.Fatal(err)
	}
	want := uint64(len("hello") + len(payload))
	var got uint64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		got = 0
		for _, sf := range u.listed(t) {
			if sf.Local == u.established.Local {
				got = sf.Carried
			}
		}
		if got >= want {
			break
		}
	}
	// The handshake's option bytes are not data: what the subflow
	// carried is the data acknowledged, at most a little more (an
	// MPTCP-level DATA_FIN has no bytes of its own).
	if got < want || got > want+64 {
		t.Fatalf("the first subflow is listed as having carried %d bytes, want %d (all the client wrote, acknowledged)", got, want)
	}
}

// A Lister looks one subflow up by its 4-tuple as a listing would show it,
// and says when there is none; its socket serves listings and lookups in
// turn.
func TestAListerLooksASubflowUpByItsFourTuple(t *testing.T) {
	u := dialUserspace(t)
	fd, err := netnsutil.Open("/var/run/netns/" + u.clientNS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	l := NewLister(fd)
	defer l.Close()
	listed, err := l.Subflows()
	if err != nil || len(listed) != 1 {
		t.Fatalf("listed %+v (%v), want the first subflow", listed, err)
	}
	sf, ok, err := l.Subflow(u.established.Local, u.established.Remote)
	if err != nil || !ok {
		t.Fatalf("looking the first subflow up: %v, found %v", err, ok)
	}
	if sf.Token != listed[0].Token || sf.Flags != listed[0].Flags || sf.Local != listed[0].Local || !sf.CarriedKnown || sf.Carried != listed[0].Carried {
		t.Errorf("looked up %+v, listed %+v", sf, listed[0])
	}
	other := netip.AddrPortFrom(u.established.Local.Addr(), u.established.Local.Port()+1)
	if _, ok, err := l.Subflow(other, u.established.Remote); err != nil || ok {
		t.Errorf("a 4-tuple without a socket: found %v, %v; want none, no error", ok, err)
	}
	if again, err := l.Subflows(); err != nil || len(again) != 1 {
		t.Errorf("a listing after the lookups: %+v, %v", again, err)
	}
}

// MPTCP_INFO counts a join from its SYN on; MPTCP_TCPINFO tells a join whose
// acceptor has answered its handshake (established, a segment received
// after the SYN-ACK) from one still waiting for its SYN-ACK. Senders that
// hold their data until the acceptor has taken the joins in rely on it.
func TestSubflowTCPInfoTellsAnsweredJoinsFromUnansweredOnes(t *testing.T) {
	u := dialUserspace(t)
	tok, local := u.established.Token, u.established.Local.Addr()
	// No host has 192.0.2.3: this join's SYN is never answered.
	if err := u.cmds.CreateSubflow(tok, local, 1, netip.MustParseAddrPort("192.0.2.3:5201"), 0); err != nil {
		t.Fatal(err)
	}
	if n := u.joins(t, 1); n != 1 {
		t.Fatalf("MPTCP_INFO counts %d joins after one SYN, want 1", n)
	}
	sfs, err := SubflowTCPInfo(u.conn.(*net.TCPConn))
	if err != nil {
		t.Fatal(err)
	}
	if len(sfs) != 2 || !sfs[0].Established || sfs[0].SegmentsIn < 2 || sfs[1].Established {
		t.Fatalf("subflows %+v, want the first established with its handshake answered, then one not established", sfs)
	}
	if err := u.cmds.CreateSubflow(tok, local, 1, u.established.Remote, 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if sfs, err = SubflowTCPInfo(u.conn.(*net.TCPConn)); err != nil {
			t.Fatal(err)
		}
		if len(sfs) == 3 && sfs[2].Established && sfs[2].SegmentsIn >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("subflows %+v 5 s after a join to the server, want it established with its handshake answered", sfs)
		}
		time.Sleep(time.Millisecond)
	}
	if sfs[1].Established {
		t.Errorf("the unanswered join is established: %+v", sfs)
	}
}
