package observe

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/internal/testutil"
)

func TestParseNetstatReadsOneGroup(t *testing.T) {
	in := `TcpExt: SyncookiesSent SyncookiesRecv
TcpExt: 1 2
MPTcpExt: MPCapableSYNRX DataCsumErr MPFailTx
MPTcpExt: 7 3 1
`
	got, err := parseNetstat(strings.NewReader(in), "MPTcpExt")
	if err != nil {
		t.Fatal(err)
	}
	if got["DataCsumErr"] != 3 || got["MPFailTx"] != 1 || got["MPCapableSYNRX"] != 7 || len(got) != 3 {
		t.Errorf("parsed %v", got)
	}
	for name, bad := range map[string]string{
		"missing group":  "TcpExt: A\nTcpExt: 1\n",
		"short values":   "MPTcpExt: A B\nMPTcpExt: 1\n",
		"not a number":   "MPTcpExt: A\nMPTcpExt: x\n",
		"names, no line": "MPTcpExt: A\n",
	} {
		if _, err := parseNetstat(strings.NewReader(bad), "MPTcpExt"); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// The agent reads a pod's counters, not its own: one MPTCP connection made
// on the loopback of a fresh namespace shows there as exactly one
// MP_CAPABLE SYN received.
func TestPodMPTCPCountersReadThePodsNamespace(t *testing.T) {
	name := testutil.NetNS(t, "mptmib-")
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	path := "/var/run/netns/" + name
	err := netnsutil.Do(path, func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		var d net.Dialer
		d.SetMultipathTCP(true)
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			return err
		}
		return s.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
	mib, err := podMPTCPCounters(path)
	if err != nil {
		t.Fatal(err)
	}
	if mib["MPCapableSYNRX"] != 1 {
		t.Errorf("MPCapableSYNRX = %v in the namespace of one MPTCP connection, want 1 (counters: %v)", mib["MPCapableSYNRX"], mib)
	}
}
