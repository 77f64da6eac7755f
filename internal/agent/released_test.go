package agent

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// The sweep of a released pod keeps the subflow records of its open sockets
// only: an MPTCP connection's subflow in the pod's namespace is listed while
// it is open and no longer once closed (TIME_WAIT), and a namespace that is
// gone has none.
func TestOpenTCPSocketsListsAPodsOpenMPTCPSubflows(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 1, PodsPerNode: 1})
	ns := "/var/run/netns/" + bed.Pod(1, 1).NetNS
	var ln net.Listener
	var client net.Conn
	err := netnsutil.Do(ns, func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		var err error
		if ln, err = lc.Listen(context.Background(), "tcp", "127.0.0.1:0"); err != nil {
			return err
		}
		var d net.Dialer
		d.SetMultipathTCP(true)
		client, err = d.Dial("tcp", ln.Addr().String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if mp, err := client.(*net.TCPConn).MultipathTCP(); err != nil || !mp {
		t.Fatalf("the connection is not MPTCP (%v): the test would not show subflows are listed", err)
	}
	local := netip.MustParseAddrPort(client.LocalAddr().String())
	remote := netip.MustParseAddrPort(client.RemoteAddr().String())

	open, err := openTCPSockets(ns)
	if err != nil {
		t.Fatal(err)
	}
	if !open[socketKey{local, remote}] || !open[socketKey{remote, local}] {
		t.Fatalf("open sockets %v lack the subflow %v <-> %v", open, local, remote)
	}

	// The client closes first and ends in TIME_WAIT.
	client.Close()
	server.Close()
	deadline := time.Now().Add(5 * time.Second)
	for open[socketKey{local, remote}] {
		if time.Now().After(deadline) {
			t.Fatalf("the closed subflow %v -> %v is still listed as open", local, remote)
		}
		time.Sleep(50 * time.Millisecond)
		if open, err = openTCPSockets(ns); err != nil {
			t.Fatal(err)
		}
	}

	if open, err := openTCPSockets("/var/run/netns/no-such-namespace"); err != nil || len(open) != 0 {
		t.Errorf("a namespace that is gone: %v, %v; want no socket and no error", open, err)
	}
}
