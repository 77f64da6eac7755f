package podnet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

const (
	clientAddr = "192.0.2.1"
	serverAddr = "192.0.2.2"
)

// pmBed is a client pod's namespace joined by a veth to a server's, which
// accepts MPTCP connections on serverAddr:5201 and reads them to the end.
type pmBed struct {
	id       string
	client   Pod
	serverNS string
}

func newPMBed(t *testing.T) *pmBed {
	t.Helper()
	testutil.RequireRoot(t, "ip")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	bed := &pmBed{id: hex.EncodeToString(b)}
	server := "mptpm-s-" + bed.id
	bed.serverNS = "/var/run/netns/" + server
	bed.client = Pod{Name: "apps.web-0", UID: "uid-1", NetNS: "/var/run/netns/mptpm-c-" + bed.id, IPs: []netip.Addr{netip.MustParseAddr(clientAddr)}}
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", "mptpm-c-"+bed.id).Run()
		_ = exec.Command("ip", "netns", "del", server).Run()
	})
	testutil.Run(t, "ip", "netns", "add", server)
	bed.addClient(t)

	var ln net.Listener
	if err := netnsutil.Do(bed.serverNS, func() error {
		lc := net.ListenConfig{}
		lc.SetMultipathTCP(true)
		var err error
		ln, err = lc.Listen(context.Background(), "tcp", serverAddr+":5201")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_, _ = io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	return bed
}

// addClient creates the client pod's namespace under its name, with its
// veth to the server, and sets MPTCP up in it as a userspace-mode rule does.
func (b *pmBed) addClient(t *testing.T) {
	t.Helper()
	client, server := "mptpm-c-"+b.id, "mptpm-s-"+b.id
	testutil.Run(t, "ip", "netns", "add", client)
	testutil.Run(t, "ip", "-n", client, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", server)
	testutil.Run(t, "ip", "-n", client, "addr", "add", clientAddr+"/24", "dev", "eth0")
	testutil.Run(t, "ip", "-n", server, "addr", "add", serverAddr+"/24", "dev", "eth0")
	testutil.Run(t, "ip", "-n", client, "link", "set", "eth0", "up")
	testutil.Run(t, "ip", "-n", server, "link", "set", "eth0", "up")
	if err := Configure(b.client, MPTCP{Subflows: Userspace, Joins: 1}); err != nil {
		t.Fatal(err)
	}
}

// recreateClient deletes the client pod's veth (as its CNI does) and
// namespace and makes a new one at the same path, as a re-created sandbox or
// a StatefulSet's next pod has. The old namespace lives on while a socket
// of it is open.
func (b *pmBed) recreateClient(t *testing.T) {
	t.Helper()
	testutil.Run(t, "ip", "-n", "mptpm-c-"+b.id, "link", "del", "eth0")
	testutil.Run(t, "ip", "netns", "del", "mptpm-c-"+b.id)
	b.addClient(t)
}

// dial opens an MPTCP connection from the client pod to the server and
// sends a first message: a v1 client is fully established, and its
// ESTABLISHED event sent, once the server has acknowledged data.
func (b *pmBed) dial(t *testing.T) net.Conn {
	t.Helper()
	conn := b.connect(t)
	if _, err := conn.Write([]byte("hello")); err != nil {
		conn.Close()
		t.Fatal(err)
	}
	return conn
}

// connect opens an MPTCP connection from the client pod to the server,
// closed at the end of the test, and sends nothing: the path manager opens
// no join before the first data (dial).
func (b *pmBed) connect(t *testing.T) net.Conn {
	t.Helper()
	var conn net.Conn
	if err := netnsutil.Do(b.client.NetNS, func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(true)
		var err error
		conn, err = d.Dial("tcp", serverAddr+":5201")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// joinsOfANewConnection opens an MPTCP connection from the client pod and
// returns how many joins it has once it has one (the rule's count here), or
// after 5 seconds.
func (b *pmBed) joinsOfANewConnection(t *testing.T) int {
	t.Helper()
	conn := b.dial(t)
	defer conn.Close()
	var info mptcpnl.Info
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var err error
		if info, err = mptcpnl.SocketInfo(conn.(*net.TCPConn)); err != nil {
			t.Fatal(err)
		}
		if info.Subflows >= 1 {
			break
		}
	}
	return int(info.Subflows)
}

func startPathManagers(t *testing.T, want ...Want) *PathManagers {
	t.Helper()
	p := NewPathManagers(slog.New(slog.DiscardHandler), PathManagerOptions{})
	t.Cleanup(p.Stop)
	if errs := p.Sync(context.Background(), want); errs != nil {
		t.Fatal(errs)
	}
	return p
}

// A pod re-created under the same name in a new namespace at the same path
// (a re-created sandbox keeps even the pod's UID) is another pod: the next
// Sync stops the path manager of the old namespace, which no connection of
// the pod uses any more, and starts one in the new, whose connections get
// their joins.
func TestRecreatedPodGetsAPathManagerInItsNewNamespace(t *testing.T) {
	bed := newPMBed(t)
	p := startPathManagers(t, Want{Pod: bed.client, Joins: 1})
	if n := bed.joinsOfANewConnection(t); n != 1 {
		t.Fatalf("a connection of the pod has %d joins, want 1", n)
	}
	old := p.get(bed.client)

	bed.recreateClient(t)
	if errs := p.Sync(context.Background(), []Want{{Pod: bed.client, Joins: 1}}); errs != nil {
		t.Fatal(errs)
	}
	if p.Len() != 1 {
		t.Errorf("%d path managers, want the new namespace's only", p.Len())
	}
	if pm := p.get(bed.client); pm == nil || pm == old {
		t.Errorf("the new namespace's path manager is %p, the old one's %p: want a new one", pm, old)
	}
	select {
	case <-old.done:
	default:
		t.Errorf("the old namespace's path manager still runs")
	}
	if n := bed.joinsOfANewConnection(t); n != 1 {
		t.Errorf("a connection of the re-created pod has %d joins, want 1", n)
	}

	// Another UID in the same namespace is another pod too.
	next := bed.client
	next.UID = "uid-2"
	if errs := p.Sync(context.Background(), []Want{{Pod: next, Joins: 2}}); errs != nil {
		t.Fatal(errs)
	}
	if n, ok := p.Joins(next); !ok || n != 2 || p.Len() != 1 {
		t.Errorf("the pod of the new UID opens %d joins (%v) among %d path managers, want 2 of its own", n, ok, p.Len())
	}
	if _, ok := p.Joins(bed.client); ok {
		t.Errorf("the pod of the old UID still has a path manager")
	}
}

// A path manager whose event socket fails (here it is closed under it, as a
// closed descriptor or a failing kernel would end its Receive) is counted,
// shown down, and started again after its backoff; the restarted one opens
// the joins of the pod's next connection.
func TestPathManagerRestartsAfterItsSocketFails(t *testing.T) {
	bed := newPMBed(t)
	p := startPathManagers(t, Want{Pod: bed.client, Joins: 1})
	if n := bed.joinsOfANewConnection(t); n != 1 {
		t.Fatalf("a connection of the pod has %d joins, want 1", n)
	}
	pm := p.get(bed.client)
	// The session is published by its goroutine: wait for it.
	sess := pm.current.Load()
	for deadline := time.Now().Add(5 * time.Second); sess == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		sess = pm.current.Load()
	}
	if sess == nil {
		t.Fatal("the path manager has no session")
	}
	sess.events.Close()

	var st []PathManagerState
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		st = p.States()
		if len(st) == 1 && st[0].Up && st[0].Restarts == 1 && pm.current.Load() != nil && pm.current.Load() != sess {
			break
		}
	}
	if len(st) != 1 || !st[0].Up || st[0].Restarts != 1 || st[0].Pod != bed.client.Name {
		t.Fatalf("after its socket failed the path manager's state is %+v, want it up again after one restart", st)
	}
	if n := bed.joinsOfANewConnection(t); n != 1 {
		t.Errorf("a connection opened after the restart has %d joins, want 1", n)
	}
}
