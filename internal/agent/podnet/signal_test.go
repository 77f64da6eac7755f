package podnet

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
)

// A signal-mode server pod is configured again at every reconcile (a path
// going down or coming back is one). Its endpoints stay as they are, and
// so do its connections' joins to the announced port: removing and adding
// the endpoint again would withdraw it (RM_ADDR) and then fail, since the
// joins hold its port, leaving the pod skipped with no endpoint. A changed
// port replaces the endpoint.
func TestConfiguringASignalServerAgainKeepsItsEndpointAndJoins(t *testing.T) {
	bed := newPMBed(t)
	server := Pod{Name: "apps.db-0", NetNS: bed.serverNS, IPs: []netip.Addr{netip.MustParseAddr(serverAddr)}}
	const signalPort = 5311
	// An endpoint of the tenant's own holds the id the kernel would give
	// first: it goes, and the rule's is added beside whatever ids are in
	// use.
	if err := withPM(server, func(c *mptcpnl.Conn) error {
		return c.AddEndpoint(mptcpnl.Endpoint{Addr: netip.MustParseAddr(serverAddr), ID: 1, Port: 6000, Flags: mptcpnl.FlagSignal})
	}); err != nil {
		t.Fatal(err)
	}
	serverRule := MPTCP{Subflows: Signal, Joins: 1, SignalPorts: []uint16{signalPort}}
	if err := Configure(server, serverRule); err != nil {
		t.Fatal(err)
	}
	if err := Configure(bed.client, MPTCP{Subflows: Signal, Joins: 1}); err != nil {
		t.Fatal(err)
	}
	conn := bed.dial(t)
	defer conn.Close()
	join := func() string {
		t.Helper()
		for _, line := range strings.Split(bed.clientSS(t, "-tnH", "state", "established", "dst", fmt.Sprintf("%s:%d", serverAddr, signalPort)), "\n") {
			if f := strings.Fields(line); len(f) >= 4 {
				return f[2] // the join's local address and port
			}
		}
		return ""
	}
	var joined string
	for deadline := time.Now().Add(5 * time.Second); joined == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the client did not join the announced port within 5 s:\n%s", bed.ss(t))
		}
		joined = join()
	}
	endpoints := func() []mptcpnl.Endpoint {
		t.Helper()
		return podMPTCPState(t, server).Endpoints
	}
	before := endpoints()
	if len(before) != 1 || before[0].Port != signalPort {
		t.Fatalf("endpoints %+v, want only the rule's on port %d", before, signalPort)
	}

	for i := range 3 {
		if err := Configure(server, serverRule); err != nil {
			t.Fatalf("configuring the server again (%d): %v", i+1, err)
		}
	}
	if after := endpoints(); !reflect.DeepEqual(after, before) {
		t.Errorf("endpoints %+v after configuring again, want %+v as they were", after, before)
	}
	time.Sleep(100 * time.Millisecond) // a RM_ADDR would have closed it by now
	if j := join(); j != joined {
		t.Errorf("the client's join is %q after the server was configured again, want %q as it was", j, joined)
	}

	// Another port: the endpoint is replaced.
	moved := serverRule
	moved.SignalPorts = []uint16{signalPort + 1}
	if err := Configure(server, moved); err != nil {
		t.Fatal(err)
	}
	if e := endpoints(); len(e) != 1 || e[0].Port != signalPort+1 || e[0].Flags != mptcpnl.FlagSignal {
		t.Errorf("endpoints %+v after the port changed, want one signal endpoint on port %d", e, signalPort+1)
	}
}
