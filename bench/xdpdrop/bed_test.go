package xdpdrop

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// bed is two network namespaces joined by a veth: the peer floods, the node
// receives on its end of the veth as on a path NIC.
type bed struct {
	peer, node     string // namespace names
	peerIf, nodeIf int    // the veth's two ends, each in its namespace
}

// The veth's name at both ends, and their MACs: those testpkt frames carry,
// so the node takes the frames as its own (a frame for another host is
// dropped before IP).
const (
	veth             = "nic"
	macPeer, macNode = "02:00:00:00:00:01", "02:00:00:00:00:02"
)

// newBed builds the namespaces (deleted when the test ends, the veth with
// them). The node forwards, as a node does for its pods, and routes the
// pods' network to a blackhole: a flood packet that no program drops goes up
// the stack to IP, finds its route and is dropped there, with no answer.
// GRO is switched on at the node's end, which gives its veth a NAPI
// context even with no XDP program: frames sent to it by XDP (the flood)
// are taken only then.
func newBed(tb testing.TB) *bed {
	tb.Helper()
	testutil.RequireRoot(tb, "ip", "sysctl")
	prefix := fmt.Sprintf("xdpb-%d-", os.Getpid())
	w := &bed{peer: testutil.NetNS(tb, prefix+"a-"), node: testutil.NetNS(tb, prefix+"b-")}
	testutil.Run(tb, "ip", "-n", w.peer, "link", "add", veth, "address", macPeer, "type", "veth", "peer", "name", veth, "address", macNode, "netns", w.node)
	testutil.Run(tb, "ip", "-n", w.peer, "addr", "add", peerAddr.String()+"/24", "dev", veth)
	testutil.Run(tb, "ip", "-n", w.node, "addr", "add", "10.99.0.2/24", "dev", veth)
	for _, ns := range []string{w.peer, w.node} {
		// No router solicitations or DAD on the veth while measuring.
		testutil.Run(tb, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
		testutil.Run(tb, "ip", "-n", ns, "link", "set", veth, "up")
	}
	testutil.Run(tb, "ip", "netns", "exec", w.node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	testutil.Run(tb, "ip", "-n", w.node, "route", "add", "blackhole", podNet.String())
	testutil.InNetNS(tb, w.peer, func() { w.peerIf = vethIndex(tb) })
	testutil.InNetNS(tb, w.node, func() {
		w.nodeIf = vethIndex(tb)
		if err := enableGRO(); err != nil {
			tb.Errorf("GRO on the node's veth: %v", err)
		}
	})
	if tb.Failed() {
		tb.FailNow()
	}
	return w
}

// vethIndex is the ifindex of the veth's end in the calling thread's
// namespace.
func vethIndex(tb testing.TB) int {
	tb.Helper()
	iface, err := net.InterfaceByName(veth)
	if err != nil {
		tb.Errorf("%s: %v", veth, err)
		return 0
	}
	return iface.Index
}

// enableGRO switches GRO on at the veth's end in the calling thread's
// namespace (SIOCETHTOOL, ETHTOOL_SGRO): iproute2 has no command for it
// and the ethtool binary is not among the project's dependencies.
func enableGRO() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	value := struct{ cmd, data uint32 }{cmd: unix.ETHTOOL_SGRO, data: 1}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte
	}
	copy(ifr.name[:], veth)
	ifr.data = unsafe.Pointer(&value)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return errno
	}
	return nil
}

// ipInReceives is the node's count of IPv4 packets that reached IP (Ip:
// InReceives of /proc/net/snmp in its namespace).
func (w *bed) ipInReceives(tb testing.TB) uint64 {
	tb.Helper()
	var n uint64
	testutil.InNetNS(tb, w.node, func() {
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			tb.Error(err)
			return
		}
		var names []string
		for _, line := range strings.Split(string(b), "\n") {
			fields := strings.Fields(line)
			if len(fields) == 0 || fields[0] != "Ip:" {
				continue
			}
			if names == nil {
				names = fields
				continue
			}
			for i, f := range names {
				if f == "InReceives" && i < len(fields) {
					n, err = strconv.ParseUint(fields[i], 10, 64)
					if err != nil {
						tb.Error(err)
					}
				}
			}
		}
	})
	return n
}

// usage is what a run took: the sending thread's run time (with no
// IRQ_TIME_ACCOUNTING it includes the softirqs run on its way out of the
// syscall: the node's receive), the time its CPU's ksoftirqd ran (softirqs
// deferred), and the wall time.
type usage struct {
	thread, ksoftirqd, wall time.Duration
}

func (u usage) cpu() time.Duration { return u.thread + u.ksoftirqd }

// schedRuntime is the time a task ran, from its schedstat: to the
// nanosecond, where getrusage rounds to the scheduler tick (4 ms at 250 Hz).
func schedRuntime(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("%s: empty", path)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	return time.Duration(ns), err
}

// ksoftirqd returns the schedstat path of ksoftirqd/cpu.
func ksoftirqd(cpu int) (string, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return "", err
	}
	want := []byte(fmt.Sprintf("ksoftirqd/%d\n", cpu))
	for _, d := range dirs {
		if comm, err := os.ReadFile(d + "/comm"); err == nil && bytes.Equal(comm, want) {
			return d + "/schedstat", nil
		}
	}
	return "", fmt.Errorf("no ksoftirqd/%d", cpu)
}

// xdpMD is struct xdp_md for BPF_PROG_TEST_RUN: the frame's end and the
// interface it runs on, whose XDP_TX sends to the veth's other end.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// flood runs prog (the flood, or the flood that goes nowhere) on n frames
// built from frame in live-frame mode, from a thread in the peer's
// namespace pinned to cpu, and returns what it cost.
func (w *bed) flood(tb testing.TB, prog *ebpf.Program, frame []byte, n uint32, cpu int) usage {
	tb.Helper()
	soft, err := ksoftirqd(cpu)
	if err != nil {
		tb.Fatal(err)
	}
	var u usage
	testutil.InNetNS(tb, w.peer, func() {
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			tb.Error(err)
			return
		}
		opts := &ebpf.RunOptions{Data: frame, Repeat: n, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES,
			Context: xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(w.peerIf)}}
		t0, err1 := schedRuntime("/proc/thread-self/schedstat")
		k0, err2 := schedRuntime(soft)
		start := time.Now()
		_, err := prog.Run(opts)
		u.wall = time.Since(start)
		t1, err3 := schedRuntime("/proc/thread-self/schedstat")
		k1, err4 := schedRuntime(soft)
		for _, e := range []error{err, err1, err2, err3, err4} {
			if e != nil {
				tb.Error(e)
				return
			}
		}
		u.thread, u.ksoftirqd = t1-t0, k1-k0
	})
	if tb.Failed() {
		tb.FailNow()
	}
	return u
}
