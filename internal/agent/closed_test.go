package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// TestClosedSubflowsAreSweptFromTheirPodsSockets: the entries node 1's
// datapath mirrored for a selected pod (signal mode: no path manager hears
// its closes) stay while the pod's socket is open, and go at a sweep once
// it has none: a connection that ended, found so by two sweeps in a row
// with no packet from the pod between; a forger that makes the pod answer
// on the 4-tuple (a reset to a forged ACK) only delays it by a look. The
// closed connection's subflow gives its place back. Entries younger than
// the grace, and a guest's (whose sockets the agent cannot see), are left
// alone. A SYN the pod refused (a closed port) wrote no entry at all. The
// live subflows the sweep counts are those whose sockets are open.
func TestClosedSubflowsAreSweptFromTheirPodsSockets(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1})
	node := bed.Node(1)
	server, client := bed.Pod(1, 1), bed.Pod(2, 1)
	settings, state, links := bedNodeState(t, bed, node, mptcpv1alpha1.CompiledRule{Name: "r", Policy: "p", SpreadMode: mptcpv1alpha1.SpreadRoundRobin,
		SubflowCreation: mptcpv1alpha1.SubflowCreationSignal},
		mptcpv1alpha1.NodePod{Namespace: "tenant", Name: "server", UID: "u-server", IPs: []string{server.Addr.String()}, Rules: []string{"r"}})
	locate := func(ips []netip.Addr) (LocatedPod, error) {
		if ips[0] != server.Addr {
			return LocatedPod{}, fmt.Errorf("no pod at %v", ips)
		}
		return LocatedPod{HostInterface: server.HostIf, NetNS: "/var/run/netns/" + server.NetNS}, nil
	}
	var a *Agent
	var plan *Plan
	testbed.Must(t, netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		var err error
		if a, err = New(settings, slog.New(slog.DiscardHandler)); err != nil {
			return err
		}
		tr := FromNodeState(settings, state, nil, links, locate, Prior{})
		if len(tr.Errors) > 0 || len(tr.PodProblems) > 0 || len(tr.Plan.Pods) != 1 {
			t.Fatalf("translation: %v, %+v, %d pods", tr.Errors, tr.PodProblems, len(tr.Plan.Pods))
		}
		plan = tr.Plan
		_, err = a.Reconcile(context.Background(), plan)
		return err
	}))
	t.Cleanup(func() {
		if err := a.Uninstall(); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})

	// The server pod listens on one port; the other is closed.
	const open, closedPort = 7000, 7001
	var ln net.Listener
	testbed.Must(t, netnsutil.Do("/var/run/netns/"+server.NetNS, func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		var err error
		ln, err = lc.Listen(context.Background(), "tcp", net.JoinHostPort(server.Addr.String(), strconv.Itoa(open)))
		return err
	}))
	defer ln.Close()
	dial := func(port int) (net.Conn, error) {
		var c net.Conn
		err := netnsutil.Do("/var/run/netns/"+client.NetNS, func() error {
			d := net.Dialer{Timeout: 5 * time.Second}
			d.SetMultipathTCP(true)
			var err error
			c, err = d.Dial("tcp", net.JoinHostPort(server.Addr.String(), strconv.Itoa(port)))
			return err
		})
		return c, err
	}
	accept := func() net.Conn {
		c, err := ln.Accept()
		testbed.Must(t, err)
		return c
	}
	stays, err := dial(open)
	testbed.Must(t, err)
	defer stays.Close()
	staysPeer := accept()
	defer staysPeer.Close()
	ends, err := dial(open)
	testbed.Must(t, err)
	endsPeer := accept()
	// A byte each way, so that both ends are established and the
	// connection is learnt, then both close.
	for _, c := range []net.Conn{ends, endsPeer} {
		_, err := c.Write([]byte{1})
		testbed.Must(t, err)
	}
	testbed.Must(t, ends.Close())
	testbed.Must(t, endsPeer.Close())
	if c, err := dial(closedPort); err == nil {
		c.Close()
		t.Fatal("the closed port accepted a connection")
	}
	remote := func(c net.Conn) netip.AddrPort { return netip.MustParseAddrPort(c.LocalAddr().String()) }
	serverSide := func() map[netip.AddrPort]bool {
		sfs, err := a.dp.Subflows()
		testbed.Must(t, err)
		out := map[netip.AddrPort]bool{}
		for _, sf := range sfs {
			if sf.Local.Addr() == server.Addr {
				out[sf.Remote] = true
			}
		}
		return out
	}
	if got := serverSide(); !got[remote(stays)] || !got[remote(ends)] || len(got) != 2 {
		t.Fatalf("the server pod's entries %v: want the two connections' (the refused SYN writes none)", got)
	}

	a.sweepSpacing = 0 // looks count however close, but where set below
	sweep := func(plan *Plan, placedBefore time.Time) int {
		t.Helper()
		n, err := a.sweepClosedSubflows(plan, placedBefore, newSweepView(a.dp))
		testbed.Must(t, err)
		return n
	}
	// A pod whose namespace cannot be listed (here a regular file where
	// its namespace was; its tenant controls what its namespace answers)
	// is left alone by the sweeps, and is no error of theirs, which would
	// fail the node's reconcile.
	unlisted := filepath.Join(t.TempDir(), "not-a-namespace")
	testbed.Must(t, os.WriteFile(unlisted, nil, 0o600))
	broken := *plan
	broken.Pods = slices.Clone(plan.Pods)
	broken.Pods[0].NetNS = unlisted
	if n := sweep(&broken, time.Now()); n != 0 {
		t.Errorf("a sweep of a pod whose sockets cannot be listed closed %d entries, want none", n)
	}
	if err := a.sweepRetiredRules(&broken, map[uint32]bool{}, newSweepView(a.dp)); err != nil {
		t.Errorf("the retired rules' sweep of a pod whose sockets cannot be listed: %v", err)
	}
	if got := serverSide(); len(got) != 2 {
		t.Fatalf("the server pod's entries after sweeps that could not list its sockets %v: want both", got)
	}
	if n := sweep(plan, time.Now().Add(-closedSubflowGrace)); n != 0 {
		t.Errorf("a sweep closed %d entries younger than the grace, want none", n)
	}
	guest := *plan
	guest.Rules = append([]PlanRule(nil), plan.Rules...)
	guest.Rules[0].Subflows = podnet.None
	if n := sweep(&guest, time.Now()); n != 0 {
		t.Errorf("a sweep closed %d entries of a guest's pod, want none", n)
	}
	// The ended connection's socket may linger a moment (FIN exchange).
	ns := "/var/run/netns/" + server.NetNS
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		socks, err := openTCPSockets(ns)
		testbed.Must(t, err)
		if !socks[socketKey{netip.AddrPortFrom(server.Addr, open), remote(ends)}] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ended connection's socket is still open")
		}
	}
	// The first sweep that finds it closed only notes it; the next
	// forgets it if the pod sent nothing on it since.
	a.sweepSpacing = time.Hour
	if n := sweep(plan, time.Now()); n != 0 {
		t.Errorf("the first sweep to find them closed forgot %d entries, want none yet", n)
	}
	// The ended connection's entry stays for now, but it is no live
	// subflow: only the remaining connection's is (mptcp_agent_live_subflows).
	live := 0
	for _, n := range a.LiveSubflows() {
		live += n
	}
	if live != 1 || len(serverSide()) != 2 {
		t.Errorf("live subflows %v with %d entries, want the remaining connection's alone", a.LiveSubflows(), len(serverSide()))
	}
	if n := sweep(plan, time.Now()); n != 0 {
		t.Errorf("a sweep right after the first (a reconcile) forgot %d entries: it is no second look", n)
	}
	a.sweepSpacing = 0
	// A forged ACK on the ended connection's 4-tuple, from a fabric: the
	// pod answers it with a reset, a packet it sends on the 4-tuple.
	sentBefore := func() uint64 {
		sfs, err := a.dp.Subflows()
		testbed.Must(t, err)
		for _, sf := range sfs {
			if sf.Remote == remote(ends) {
				return sf.Counters.TxPackets
			}
		}
		t.Fatal("the ended connection's entry went before the second look")
		return 0
	}
	tx := sentBefore()
	forged := testpkt.Frame{Src: remote(ends).Addr(), Dst: server.Addr, TCP: &testpkt.TCP{SrcPort: remote(ends).Port(), DstPort: open,
		Seq: 12345, Ack: 67890, Flags: testpkt.ACK, Window: 64240}}.Bytes()[14:]
	testbed.Must(t, bed.Forge(bed.Fabrics[0], [][]byte{forged}, 0))
	for deadline := time.Now().Add(5 * time.Second); sentBefore() == tx; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pod sent nothing on the ended 4-tuple after the forged ACK")
		}
	}
	if n := sweep(plan, time.Now()); n != 0 {
		t.Errorf("the second sweep forgot %d entries, want none: the pod sent on the ended 4-tuple since the first", n)
	}
	if n := sweep(plan, time.Now()); n != 1 {
		t.Errorf("the third sweep forgot %d entries, want 1: the ended connection's, quiet since", n)
	}
	if got := serverSide(); !got[remote(stays)] || len(got) != 1 {
		t.Errorf("the server pod's entries after the sweep %v: want only the open connection's %v", got, remote(stays))
	}
	stats, err := a.dp.Stats()
	testbed.Must(t, err)
	if n := stats[datapath.StatSubflowClosed]; n != 1 {
		t.Errorf("subflows that gave their place back = %d, want 1: the ended connection's", n)
	}
}
