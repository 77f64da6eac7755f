package testbed

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// In signal mode the server pod's in-kernel path manager announces a port
// (ADD_ADDR) and the client's joins it. A join lost to a failure should be
// made again; in signal mode that would mean announcing the port again. This kernel (6.18) allows neither half of that:
//
//   - the endpoint cannot be announced again while any connection's join
//     to it lives: re-adding it (the only way to announce again) fails
//     with EADDRINUSE, since the live joins hold the port;
//   - a client whose join to an announced port closed does not join it
//     again when it is announced again: its path manager counts the
//     accepted announcement (add_addr_accepted) until a RM_ADDR closes the
//     join, and a join closed otherwise never gives the count back.
//
// So signal mode keeps the joins it has through a failure (the datapath
// detours them, the agent never closes them) and does not re-create the
// ones something else closed; userspace mode, the default, does
// (docs/subflows.md, "Signal mode and closed joins"). This test pins both
// facts: a kernel that changes either fails it, and the choice is then
// worth making again.
func TestASignalledPortIsNotJoinedAgainAfterItsJoinClosed(t *testing.T) {
	const port, signalPort = 5201, 5311
	b := NewForTest(t, Config{Nodes: 2, NICs: 1, PodsPerNode: 1, LinkRate: "200mbit"})
	client, server := b.Pod(1, 1), b.Pod(2, 1)
	Must(t, b.ConfigureSignalPorts(server, []int{signalPort}))
	Must(t, b.ConfigureClientLimits(client, 1, 1))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	bin := BuildTraffic(t)
	srv, err := b.StartTrafficServer(ctx, bin, server, port, true)
	Must(t, err)
	// One paced connection that lasts the test (the sender waits for its
	// join before it writes).
	sent := make(chan error, 1)
	go func() {
		_, err := b.Send(ctx, bin, client, srv.Addr, true, "-conns", "1", "-duration", "12s", "-rate-mbit", "10")
		sent <- err
	}()
	join := netip.AddrPortFrom(server.Addr, signalPort)
	joins := func() []string {
		t.Helper()
		out, err := b.Command(client.NetNS, "ss", "-tnH", "state", "established", "dst", join.String()).Output()
		if err != nil {
			t.Fatalf("ss: %v", err)
		}
		return strings.Fields(string(out))
	}
	waitFor := func(what string, within time.Duration, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(within); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, within)
			}
		}
	}
	waitFor("the client's join to the announced port", 5*time.Second, func() bool { return len(joins()) > 0 })
	endpoint := fmt.Sprintf("mptcp endpoint add %s dev eth0 port %d signal", server.Addr, signalPort)
	announced := func() float64 {
		t.Helper()
		n, err := b.KernelCounter(client.NetNS, "MPTcpExtAddAddr")
		Must(t, err)
		return n
	}

	// Announcing again while the join lives: the endpoint goes (its
	// RM_ADDR leaves the join as it is) and cannot come back.
	Must(t, ipBatch(ctx, server.NetNS, "mptcp endpoint flush"))
	time.Sleep(time.Second) // the flushed listener's own delay (ConfigureSignalPorts)
	if err := ipBatch(ctx, server.NetNS, endpoint); err == nil || !strings.Contains(err.Error(), "-98") {
		t.Fatalf("re-adding the signal endpoint while a join to it lives: %v, want EADDRINUSE (-98)", err)
	}
	if len(joins()) == 0 {
		t.Fatal("the join closed when its endpoint was removed: removing and re-adding an endpoint would re-create joins")
	}

	// The join closes (as a reset would close it); now the port can be
	// announced again, the client hears it, and does not join.
	before := announced()
	Must(t, b.Command(client.NetNS, "ss", "-K", "-tnH", "state", "established", "dst", join.String()).Run())
	waitFor("the join closing", 2*time.Second, func() bool { return len(joins()) == 0 })
	waitFor("re-adding the signal endpoint once no join holds its port", 5*time.Second, func() bool {
		return ipBatch(ctx, server.NetNS, endpoint) == nil
	})
	waitFor("the client hearing the port announced again", 2*time.Second, func() bool { return announced() > before })
	time.Sleep(time.Second)
	if j := joins(); len(j) != 0 {
		t.Fatalf("the client joined the port announced again (%v): this kernel re-creates signalled joins; revisit docs/subflows.md and this test", j)
	}
	select {
	case err := <-sent:
		t.Fatalf("the connection ended before the test did: %v", err)
	default:
	}
	cancel()
	<-sent
}

// A port the server pod cannot announce because another socket holds it
// is refused after the listener's own delay, and the error lists the pod's
// sockets in every state, so that what held it (a listener, a join, a
// TIME_WAIT) is named in the failure.
func TestASignalPortHeldByAnotherSocketIsRefusedNamingIt(t *testing.T) {
	const port = 5321
	b := NewForTest(t, Config{Nodes: 2, NICs: 1, PodsPerNode: 1})
	server := b.Pod(2, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := b.StartTrafficServer(ctx, BuildTraffic(t), server, port, false)
	Must(t, err)
	err = b.ConfigureSignalPorts(server, []int{port})
	if err == nil || !strings.Contains(err.Error(), "-98") {
		t.Fatalf("announcing a port a plain TCP server listens on: %v, want EADDRINUSE (-98)", err)
	}
	if !strings.Contains(err.Error(), "LISTEN") || !strings.Contains(err.Error(), fmt.Sprintf(":%d", port)) {
		t.Errorf("the error does not name the listener holding port %d: %v", port, err)
	}
}
