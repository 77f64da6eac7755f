package mptcpnl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/internal/testutil"
)

// pair creates two namespaces joined by a veth: client 192.0.2.1, server 192.0.2.2.
func pair(t *testing.T) (clientNS, serverNS string) {
	t.Helper()
	testutil.RequireRoot(t, "ip")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	clientNS, serverNS = "mptnl-c-"+id, "mptnl-s-"+id
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", clientNS).Run()
		_ = exec.Command("ip", "netns", "del", serverNS).Run()
	})
	sh("netns", "add", clientNS)
	sh("netns", "add", serverNS)
	sh("-n", clientNS, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", serverNS)
	sh("-n", clientNS, "addr", "add", "192.0.2.1/24", "dev", "eth0")
	sh("-n", serverNS, "addr", "add", "192.0.2.2/24", "dev", "eth0")
	sh("-n", clientNS, "link", "set", "eth0", "up")
	sh("-n", serverNS, "link", "set", "eth0", "up")
	return clientNS, serverNS
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

// As a userspace path manager, the agent opens joins from the connection's
// own address to the same server address and port; the kernel picks each
// join's source port, so nothing but the token ties them together.
func TestUserspacePathManagerCreatesJoinsFromSameAddress(t *testing.T) {
	clientNS, serverNS := pair(t)
	if err := netnsutil.WriteSysctl("/var/run/netns/"+clientNS, "net.mptcp.path_manager", "userspace"); err != nil {
		t.Fatal(err)
	}
	server := dialIn(t, serverNS)
	if err := server.SetLimits(Limits{Subflows: 3}); err != nil {
		t.Fatal(err)
	}
	events := dialIn(t, clientNS)
	if err := events.SubscribeEvents(); err != nil {
		t.Fatal(err)
	}
	cmds := dialIn(t, clientNS)

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
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = io.Copy(io.Discard, c)
			c.Close()
		}
	}()

	var conn net.Conn
	if err := netnsutil.Do("/var/run/netns/"+clientNS, func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(true)
		var err error
		conn, err = d.Dial("tcp", "192.0.2.2:5201")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A v1 client is fully established (and may join) once the server has
	// acknowledged data at the MPTCP level: send some, as any client would.
	if _, err := conn.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(5 * time.Second)
	var established *Event
	for established == nil && time.Now().Before(deadline) {
		evs, err := events.Receive()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Type != EventEstablished {
				continue
			}
			if ev.ServerSide {
				t.Fatalf("client-side connection reported as server side: %+v", ev)
			}
			if ev.Local != conn.LocalAddr().(*net.TCPAddr).AddrPort() {
				t.Fatalf("event for %v, want the dialled connection %v", ev.Local, conn.LocalAddr())
			}
			established = &ev
		}
	}
	if established == nil {
		t.Fatal("no ESTABLISHED event for the client connection")
	}
	// The initial subflow's address has id 0; joins from the same address
	// are given a non-zero local id.
	// The last is opened as a backup subflow.
	for i := 0; i < 3; i++ {
		var flags uint32
		if i == 2 {
			flags = FlagBackup
		}
		if err := cmds.CreateSubflow(established.Token, established.Local.Addr(), 1, established.Remote, flags); err != nil {
			t.Fatalf("create subflow %d: %v", i, err)
		}
	}
	// The namespace has one address, so three open joins to the same server
	// address and port can differ only by their kernel-chosen source ports.
	var info Info
	for info.Subflows != 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		var err error
		if info, err = SocketInfo(conn.(*net.TCPConn)); err != nil {
			t.Fatal(err)
		}
	}
	if info.Subflows != 3 {
		t.Fatalf("client kernel reports %d joins, want 3", info.Subflows)
	}
	requireSubflowsListed(t, clientNS, *established)
}

// requireSubflowsListed checks what ListSubflows says of the connection of
// established: its first subflow opened here with MP_CAPABLE, and three
// joins from local id 1, the last of them a backup.
func requireSubflowsListed(t *testing.T, ns string, established Event) {
	t.Helper()
	fd, err := netnsutil.Open("/var/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	sfs, err := ListSubflows(fd)
	if err != nil {
		t.Fatal(err)
	}
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
