package controlplane_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/controlplane"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// The relay answers the API server's address inside a node namespace, where
// an agent runs, with the API server itself.
func TestRelayReachesAPIServerFromNodeNamespace(t *testing.T) {
	assets := testenv.Assets(t)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 1, PodsPerNode: 0})
	cp, err := controlplane.Start(context.Background(), controlplane.Options{Assets: assets, Dir: t.TempDir(), Controller: "/bin/sleep"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	u, _ := url.Parse(cp.Env.Config.Host)
	if _, err := dialIn(bed.Node(1).NetNS, u.Host); err == nil {
		t.Fatalf("%s answered inside the node namespace before any relay: the test proves nothing", u.Host)
	}
	if _, err := cp.RelayInto(bed.Node(1).NetNS); err != nil {
		t.Fatal(err)
	}
	c, err := dialIn(bed.Node(1).NetNS, u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only proves an API server answers
	fmt.Fprintf(tc, "GET /livez HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", u.Host)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatalf("no HTTP answer through the relay: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
		t.Fatalf("unexpected status through the relay: %s", resp.Status)
	}
}

// dialIn connects to addr from inside namespace ns.
func dialIn(ns, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, err
	}
	target, err := netns.GetFromName(ns)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return nil, err
	}
	c, derr := net.DialTimeout("tcp", addr, 2*time.Second)
	if err := netns.Set(orig); err != nil {
		return nil, err // the thread stays locked and is retired
	}
	orig.Close()
	runtime.UnlockOSThread()
	return c, derr
}
