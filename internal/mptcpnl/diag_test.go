package mptcpnl

import (
	"context"
	"encoding/binary"
	"errors"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// A pod's processes decide what a listing of its namespace meets, so a
// listing (ListSubflows, ListOpenTCPSockets) runs on a socket connected to
// the kernel, and is bounded: a process of the namespace that sends to the
// listing's socket (with CAP_NET_ADMIN, which unicast to another netlink
// socket needs) is refused, and more sockets than the bound are an error,
// not a longer listing.
func TestSocketListingsAreConnectedAndBounded(t *testing.T) {
	ns, peer := pair(t)
	path, fd := openNS(t, ns)
	// A listener and two connections to it from the other namespace: the
	// listener's namespace has the two accepted sockets, which are listed,
	// and the listener, which is not (it is no subflow).
	var ln net.Listener
	if err := netnsutil.Do(path, func() error {
		var err error
		ln, err = (&net.ListenConfig{}).Listen(context.Background(), "tcp", "192.0.2.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var dialed []string
	if err := netnsutil.Do("/var/run/netns/"+peer, func() error {
		for range 2 {
			c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
			if err != nil {
				return err
			}
			t.Cleanup(func() { c.Close() })
			dialed = append(dialed, c.LocalAddr().String())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	socks, err := ListOpenTCPSockets(fd)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range dialed {
		found := false
		for _, s := range socks {
			found = found || s.Remote.String() == want
		}
		if !found {
			t.Errorf("the connection from %s not listed in %+v", want, socks)
		}
	}
	if len(socks) != 2 {
		t.Errorf("listed %d sockets, want the 2 accepted ones, not the listener: %+v", len(socks), socks)
	}
	err = listTCP(fd, openStates, 0, 1, func([]byte) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "more than 1 TCP sockets") {
		t.Errorf("a listing bounded at 1 of 2 sockets: %v, want an error", err)
	}

	c, err := dialSockDiag(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var port uint32
	if err := raw.Control(func(s uintptr) {
		sa, serr := unix.Getsockname(int(s))
		if nl, ok := sa.(*unix.SockaddrNetlink); serr == nil && ok {
			port = nl.Pid
		}
	}); err != nil || port == 0 {
		t.Fatalf("the listing socket's port id: %d, %v", port, err)
	}
	// An NLMSG_DONE, as a forger would end a dump early.
	msg := make([]byte, unix.NLMSG_HDRLEN+4)
	binary.NativeEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:6], unix.NLMSG_DONE)
	err = netnsutil.Do(path, func() error {
		s, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
		if err != nil {
			return err
		}
		defer unix.Close(s)
		return unix.Sendto(s, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Pid: port})
	})
	if !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("a process of the namespace sent to the listing's socket: %v, want ECONNREFUSED", err)
	}
}

// A listener that asked for MPTCP is told from one that asked for TCP, in
// both families; sockets that do not listen are not listed.
func TestListenersSayWhetherTheyTakeMPTCP(t *testing.T) {
	ns, _ := pair(t)
	path, fd := openNS(t, ns)
	want := map[string]bool{}
	if err := netnsutil.Do(path, func() error {
		for _, c := range []struct {
			network, addr string
			mptcp         bool
		}{
			{"tcp4", "192.0.2.1:0", false},
			{"tcp4", "192.0.2.1:0", true},
			{"tcp6", "[::]:0", true},
			{"tcp6", "[::]:0", false},
		} {
			lc := net.ListenConfig{}
			lc.SetMultipathTCP(c.mptcp)
			ln, err := lc.Listen(context.Background(), c.network, c.addr)
			if err != nil {
				return err
			}
			t.Cleanup(func() { ln.Close() })
			want[ln.Addr().String()] = c.mptcp
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got, err := ListListeners(fd, 16)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, l := range got {
		listed[l.Local.String()] = l.MPTCP
	}
	if !maps.Equal(listed, want) {
		t.Errorf("listeners %v, want %v (address: MPTCP)", listed, want)
	}
}

// openNS opens the namespace ns for the test, and returns its path too.
func openNS(t *testing.T, ns string) (string, int) {
	t.Helper()
	path := "/var/run/netns/" + ns
	fd, err := netnsutil.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return path, fd
}
