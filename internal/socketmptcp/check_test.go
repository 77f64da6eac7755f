package socketmptcp

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

const ipprotoMPTCP = 262

// The program's decision, run as the syscall program that shares it
// (bpf/test/socket_mptcp_check.c) over the namespaces setNamespaces
// wrote: MPTCP for the TCP streams of IPv4 and IPv6 in a listed
// namespace, and every other socket as asked.
func TestOnlyTCPStreamsOfListedNamespacesBecomeMPTCP(t *testing.T) {
	testutil.RequireRoot(t)
	var objs socketCheckObjects
	if err := loadSocketCheckObjects(&objs, nil); err != nil {
		t.Fatalf("loading the check program: %v", err)
	}
	defer objs.Close()
	const listed, dropped, other = 0x1001, 0x1002, 0x2002
	if err := setNamespaces(objs.TransparentNetns, map[uint64]bool{listed: true, dropped: true}); err != nil {
		t.Fatal(err)
	}
	if err := setNamespaces(objs.TransparentNetns, map[uint64]bool{listed: true}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name                  string
		family, typ, protocol int32
		cookie                uint64
		want                  int32
	}{
		{"IPv4 TCP, protocol 0", unix.AF_INET, unix.SOCK_STREAM, 0, listed, ipprotoMPTCP},
		{"IPv4 TCP, IPPROTO_TCP", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_TCP, listed, ipprotoMPTCP},
		{"IPv6 TCP", unix.AF_INET6, unix.SOCK_STREAM, 0, listed, ipprotoMPTCP},
		{"already MPTCP", unix.AF_INET, unix.SOCK_STREAM, ipprotoMPTCP, listed, ipprotoMPTCP},
		{"UDP", unix.AF_INET, unix.SOCK_DGRAM, 0, listed, 0},
		{"SCTP stream", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP, listed, unix.IPPROTO_SCTP},
		{"unix stream", unix.AF_UNIX, unix.SOCK_STREAM, 0, listed, 0},
		{"raw", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_TCP, listed, unix.IPPROTO_TCP},
		{"a namespace not listed", unix.AF_INET, unix.SOCK_STREAM, 0, other, 0},
		{"a namespace no longer listed", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_TCP, dropped, unix.IPPROTO_TCP},
	} {
		call := socketCheckSocketCall{Family: c.family, Type: c.typ, Protocol: c.protocol, Cookie: c.cookie, Result: -1}
		var out socketCheckSocketCall
		if _, err := objs.SocketMptcpCheck.Run(&ebpf.RunOptions{Context: call, ContextOut: &out}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if out.Result != c.want {
			t.Errorf("%s: protocol %d, want %d", c.name, out.Result, c.want)
		}
	}
}

// Load attaches the program where the kernel runs tracing programs, and
// then a TCP socket of a listed namespace is MPTCP and one of another is
// not; where the kernel refuses (lockdown, or no hook), Load says why.
func TestLoadAttachesOrSaysWhyNot(t *testing.T) {
	testutil.RequireRoot(t, "ip")
	p, err := Load()
	var unsupported *UnsupportedError
	if errors.As(err, &unsupported) {
		t.Logf("refused, as the node state would say: %v", err)
		if unsupported.Err == nil || !strings.Contains(err.Error(), "update_socket_protocol") {
			t.Errorf("the error %q does not say what the kernel refused", err)
		}
		if errors.Is(err, unix.EPERM) && !unsupported.Permanent {
			t.Errorf("a refusal with EPERM is taken as passing: %v", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("Load failed without saying the kernel refuses it: %v", err)
	}
	defer p.Close()
	listed, other := testNamespace(t, "socketmptcp-a"), testNamespace(t, "socketmptcp-b")
	fd, err := netnsutil.Open(listed)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cookie, err := NetNSCookie(fd)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Set(map[uint64]bool{cookie: true}); err != nil {
		t.Fatal(err)
	}
	for ns, want := range map[string]int{listed: ipprotoMPTCP, other: unix.IPPROTO_TCP} {
		if got := socketProtocol(t, ns); got != want {
			t.Errorf("a TCP socket created in %s has protocol %d, want %d", ns, got, want)
		}
	}
}

func testNamespace(t *testing.T, name string) string {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return "/var/run/netns/" + name
}

func socketProtocol(t *testing.T, ns string) int {
	t.Helper()
	var proto int
	err := netnsutil.Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		proto, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return proto
}
