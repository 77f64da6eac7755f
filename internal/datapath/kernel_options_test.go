package datapath

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

const (
	ipprotoMPTCP = 262 // IPPROTO_MPTCP
	solMPTCP     = 284 // SOL_MPTCP
	mptcpInfo    = 1   // MPTCP_INFO: struct mptcp_info, its token at byte 12
)

// kernelJoinReading is what the kernel made of one join SYN, from its MPTCP
// counters: an MP_JOIN read (MPJoinSynRx), with B (MPJoinSynBackupRx), and
// its token not found (MPJoinNoTokenFound).
type kernelJoinReading struct {
	join, backup, noToken bool
}

// mptcpCounters reads the MPTcpExt counters of the calling thread's network
// namespace.
func mptcpCounters() (map[string]uint64, error) {
	b, err := os.ReadFile("/proc/thread-self/net/netstat")
	if err != nil {
		return nil, err
	}
	var names []string
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "MPTcpExt:" {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		for i, v := range f[1:] {
			if i < len(names) {
				n, _ := strconv.ParseUint(v, 10, 64)
				out[names[i]] = n
			}
		}
	}
	return out, sc.Err()
}

// tcpInSegs is the calling thread's namespace's count of TCP segments
// received.
func tcpInSegs() uint64 {
	b, err := os.ReadFile("/proc/thread-self/net/snmp")
	if err != nil {
		return 0
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		for i, v := range f[1:] {
			if i < len(names) && names[i] == "InSegs" {
				n, _ := strconv.ParseUint(v, 10, 64)
				return n
			}
		}
	}
	return 0
}

// Linux reads a join SYN's option list the way the parser assumes (parse.h,
// OPTS_END_EOL): shown on the running kernel, in a network namespace of the
// test's own, by its MPTCP counters for SYNs sent from a raw socket to an
// MPTCP listener on lo. It keeps the MP_JOIN before a broken option, reads
// none after one, reads on after an MPTCP option of length 2, takes B from
// the last of MP_JOIN and MP_PRIO and the token from the last MP_JOIN. The
// same segments through pod_egress (the source selected): the datapath reads
// the same join, or drops a segment on which it could read another.
func TestTheKernelReadsJoinOptionsAsTheParserDoes(t *testing.T) {
	testutil.RequireRoot(t, "ip")
	lo := netip.MustParseAddr("127.0.0.1")
	const port = 5201
	const bogus = 0x5a5a5a5a
	mpj := func(token uint32, b bool) []byte { return testpkt.MPJoinSYN(token, 0x11223344, 1, b) }
	// token is filled in with the connection's once it is open.
	var token uint32
	cases := []struct {
		name   string
		opts   func() []byte
		kernel kernelJoinReading
		// datapath: what pod_egress makes of it: "join" (read, counted
		// StatJoinSyn), "none", or "dropped" (StatMPTCPOptsAmbiguous).
		datapath string
	}{
		{"MP_JOIN B=1 alone", func() []byte { return mpj(bogus, true) },
			kernelJoinReading{true, true, true}, "join"},
		{"MP_JOIN B=1 then 0x42 0x00", func() []byte { return testpkt.Join(mpj(bogus, true), []byte{0x42, 0, 1, 1}) },
			kernelJoinReading{true, true, true}, "join"},
		{"MP_JOIN B=1 then an option running past the header", func() []byte { return testpkt.Join(mpj(bogus, true), []byte{1, 1, 30, 40}) },
			kernelJoinReading{true, true, true}, "join"},
		{"MP_JOIN B=1 then a kind byte without its length", func() []byte { return testpkt.Join(mpj(bogus, true), []byte{1, 1, 1, 8}) },
			kernelJoinReading{true, true, true}, "join"},
		{"0x42 0x00 before MP_JOIN B=1", func() []byte { return testpkt.Join([]byte{0x42, 0, 1, 1}, mpj(bogus, true)) },
			kernelJoinReading{false, false, false}, "none"},
		{"EOL before MP_JOIN B=1", func() []byte { return testpkt.Join([]byte{1, 1, 1, 0}, mpj(bogus, true)) },
			kernelJoinReading{false, false, false}, "none"},
		{"an MPTCP option of length 2, then MP_JOIN B=1", func() []byte { return testpkt.Join([]byte{30, 2, 1, 1}, mpj(bogus, true)) },
			kernelJoinReading{true, true, true}, "dropped"},
		{"MP_JOIN B=1 then MP_PRIO B=0", func() []byte { return testpkt.Join(mpj(bogus, true), testpkt.MPPrio(false), testpkt.NOP()) },
			kernelJoinReading{true, false, true}, "dropped"},
		{"MP_PRIO B=0 then MP_JOIN B=1", func() []byte { return testpkt.Join(testpkt.MPPrio(false), testpkt.NOP(), mpj(bogus, true)) },
			kernelJoinReading{true, true, true}, "dropped"},
		{"MP_JOIN B=0 then MP_JOIN of SYN-ACK length B=1", func() []byte { return testpkt.Join(mpj(bogus, false), testpkt.MPJoinSYNACK(1, 2, 1, true)) },
			kernelJoinReading{true, true, true}, "dropped"},
		{"MP_JOIN with the connection's token then one with another", func() []byte { return testpkt.Join(mpj(token, false), mpj(bogus, false)) },
			kernelJoinReading{true, false, true}, "dropped"},
		{"MP_JOIN with another token then one with the connection's", func() []byte { return testpkt.Join(mpj(bogus, false), mpj(token, false)) },
			kernelJoinReading{true, false, false}, "dropped"},
	}

	ns := testutil.NetNS(t, "mptcpopts-")
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	got := make([]kernelJoinReading, len(cases))
	var noMPTCP, noBackupCounter bool
	testutil.InNetNS(t, ns, func() {
		sock := func(typ, proto int) int {
			fd, err := unix.Socket(unix.AF_INET, typ, proto)
			if err != nil {
				if proto == ipprotoMPTCP && (errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ENOPROTOOPT)) {
					noMPTCP = true
				} else {
					t.Errorf("socket: %v", err)
				}
				return -1
			}
			t.Cleanup(func() { unix.Close(fd) })
			return fd
		}
		addr := &unix.SockaddrInet4{Port: port, Addr: lo.As4()}
		lfd := sock(unix.SOCK_STREAM, ipprotoMPTCP)
		if lfd < 0 {
			return
		}
		if err := unix.Bind(lfd, addr); err != nil {
			t.Errorf("bind: %v", err)
			return
		}
		if err := unix.Listen(lfd, 16); err != nil {
			t.Errorf("listen: %v", err)
			return
		}
		cfd := sock(unix.SOCK_STREAM, ipprotoMPTCP)
		if err := unix.Connect(cfd, addr); err != nil {
			t.Errorf("connect: %v", err)
			return
		}
		afd, _, err := unix.Accept(lfd)
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		t.Cleanup(func() { unix.Close(afd) })
		// A byte each way: the connection is established on both sides.
		buf := make([]byte, 1)
		if _, err := unix.Write(cfd, []byte("x")); err != nil {
			t.Errorf("write: %v", err)
			return
		}
		if _, err := unix.Read(afd, buf); err != nil {
			t.Errorf("read: %v", err)
			return
		}
		info := make([]byte, 256)
		n := uint32(len(info))
		if _, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(afd), solMPTCP, mptcpInfo,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0); errno != 0 || n < 16 {
			t.Errorf("MPTCP_INFO: %v (%d bytes)", errno, n)
			return
		}
		token = binary.NativeEndian.Uint32(info[12:16])
		raw := sock(unix.SOCK_RAW, unix.IPPROTO_TCP)
		if raw < 0 {
			return
		}
		for i, c := range cases {
			frame := testpkt.Frame{Src: lo, Dst: lo, TCP: &testpkt.TCP{SrcPort: uint16(41000 + i), DstPort: port, Seq: 1000, Flags: testpkt.SYN, Options: c.opts()}}.Bytes()
			before, err := mptcpCounters()
			if err != nil {
				t.Errorf("counters: %v", err)
				return
			}
			segs := tcpInSegs()
			if err := unix.Sendto(raw, frame[14+20:], 0, &unix.SockaddrInet4{Addr: lo.As4()}); err != nil {
				t.Errorf("%s: sendto: %v", c.name, err)
				return
			}
			for deadline := time.Now().Add(2 * time.Second); tcpInSegs() == segs && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond)
			after, err := mptcpCounters()
			if err != nil {
				t.Errorf("counters: %v", err)
				return
			}
			if _, ok := after["MPJoinSynBackupRx"]; !ok {
				noBackupCounter = true
			}
			got[i] = kernelJoinReading{
				join:    after["MPJoinSynRx"] > before["MPJoinSynRx"],
				backup:  after["MPJoinSynBackupRx"] > before["MPJoinSynBackupRx"],
				noToken: after["MPJoinNoTokenFound"] > before["MPJoinNoTokenFound"],
			}
		}
	})
	if noMPTCP {
		testutil.Unavailable(t, "the kernel has no MPTCP")
	}
	if t.Failed() {
		return
	}

	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(lo, 0); err != nil {
		t.Fatal(err)
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := c.kernel
			if noBackupCounter {
				t.Log("the kernel counts no MPJoinSynBackupRx (before 6.10): B not checked")
				want.backup, got[i].backup = false, false
			}
			if got[i] != want {
				t.Errorf("the kernel read %+v, want %+v", got[i], want)
			}
			frame := testpkt.Frame{Src: lo, Dst: lo, TCP: &testpkt.TCP{SrcPort: uint16(42000 + i), DstPort: port, Seq: 1000, Flags: testpkt.SYN, Options: c.opts()}}.Bytes()
			joins, dropped := stat(t, dp, StatJoinSyn), stat(t, dp, StatMPTCPOptsAmbiguous)
			ret, _ := runVerdict(t, dp.objs.PodEgress, frame, skbContext{})
			read := "none"
			switch {
			case ret == tcActShot && stat(t, dp, StatMPTCPOptsAmbiguous) == dropped+1:
				read = "dropped"
			case stat(t, dp, StatJoinSyn) == joins+1:
				read = "join"
			}
			if read != c.datapath {
				t.Errorf("the datapath: %s (verdict %d), want %s", read, int32(ret), c.datapath)
			}
		})
	}
}
