package preload

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

const ipprotoMPTCP, ipprotoTCP = "262", "6"

// builtClient installs the library as the agent does and builds
// testdata/sockets.c, a C program that knows nothing of MPTCP.
func builtClient(t *testing.T) (lib, client string) {
	t.Helper()
	dir := t.TempDir()
	lib, err := Install(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(lib); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("installed library: %v, mode %v; want readable by every user", err, fi.Mode())
	}
	client = filepath.Join(dir, "sockets")
	testutil.CompileC(t, filepath.Join("testdata", "sockets.c"), client)
	return lib, client
}

// protocols runs client with env and returns the protocol of each socket it
// opened, by name.
func protocols(t *testing.T, client string, env []string, args ...string) map[string]string {
	t.Helper()
	cmd := exec.Command(client, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", client, err, out)
	}
	got := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			got[f[0]] = f[1]
		} else if len(f) == 1 {
			got[f[0]] = ""
		}
	}
	return got
}

// Loaded into a C program, the library makes its TCP sockets MPTCP
// (whatever flags they are opened with) and leaves every other socket as
// it was; without it the same program opens TCP.
func TestTCPSocketsBecomeMPTCPAndNothingElseChanges(t *testing.T) {
	lib, client := builtClient(t)
	plain := protocols(t, client, nil)
	wrapped := protocols(t, client, []string{"LD_PRELOAD=" + lib})
	for name, want := range map[string]string{
		"inet-stream":           ipprotoMPTCP,
		"inet-stream-tcp":       ipprotoMPTCP,
		"inet6-stream-flags":    ipprotoMPTCP,
		"inet-dgram":            plain["inet-dgram"],
		"unix-stream":           plain["unix-stream"],
		"inet-stream-sctp-like": plain["inet-stream-sctp-like"],
	} {
		if wrapped[name] != want {
			t.Errorf("%s with the library: protocol %q, want %q", name, wrapped[name], want)
		}
	}
	if plain["inet-stream"] != ipprotoTCP {
		t.Errorf("without the library the program opened protocol %q, want TCP: the test proves nothing", plain["inet-stream"])
	}
}

// Beside another preload library that interposes socket() too, in either
// order, both act: the sockets are MPTCP and the other library sees every
// call (each passes the call on to the next definition).
func TestAnotherPreloadLibraryKeepsWorking(t *testing.T) {
	lib, client := builtClient(t)
	other := filepath.Join(t.TempDir(), "libcounter.so")
	testutil.CompileC(t, filepath.Join("testdata", "counter.c"), other, "-shared", "-fPIC", "-ldl")
	for _, order := range []string{lib + ":" + other, other + ":" + lib} {
		cmd := exec.Command(client)
		cmd.Env = append(os.Environ(), "LD_PRELOAD="+order)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("LD_PRELOAD=%s: %v: %s", order, err, stderr.String())
		}
		if !strings.Contains(string(out), "inet-stream "+ipprotoMPTCP+"\n") {
			t.Errorf("LD_PRELOAD=%s: %s, want inet-stream MPTCP", order, out)
		}
		if n := strings.Count(stderr.String(), "counter: socket"); n < 6 {
			t.Errorf("LD_PRELOAD=%s: the other library saw %d socket calls, want all 6", order, n)
		}
	}
}

// A connection the program makes is MPTCP on the wire: the listener, which
// accepts both, sees an MPTCP connection from the wrapped program and a TCP
// one from the same program without the library.
func TestAWrappedProgramConnectsWithMPTCP(t *testing.T) {
	lib, client := builtClient(t)
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(true)
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, c := range []struct {
		env  []string
		want bool
	}{{[]string{"LD_PRELOAD=" + lib}, true}, {nil, false}} {
		accepted := make(chan bool, 1)
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				accepted <- false
				return
			}
			defer conn.Close()
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			line, _ := bufio.NewReader(conn).ReadString('\n')
			mptcp, _ := conn.(*net.TCPConn).MultipathTCP()
			accepted <- mptcp && strings.HasPrefix(line, "hello")
		}()
		if got := protocols(t, client, c.env, "127.0.0.1", strconv.Itoa(port)); len(got) == 0 {
			t.Fatal("the client printed nothing")
		}
		if got := <-accepted; got != c.want {
			t.Errorf("with env %v the listener saw an MPTCP connection carrying the line: %v, want %v", c.env, got, c.want)
		}
	}
}

// Where the kernel refuses MPTCP (net.mptcp.enabled=0 in the program's
// network namespace), the program gets the TCP sockets it asked for.
func TestWhereMPTCPIsOffTheProgramGetsTCP(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.Unavailable(t, "needs root (a network namespace of its own with MPTCP off)")
	}
	lib, client := builtClient(t)
	// unshare gives the program a network namespace that ends with it.
	cmd := exec.Command("unshare", "--net", "sh", "-c", `echo 0 > /proc/sys/net/mptcp/enabled && exec "$0"`, client)
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, name := range []string{"inet-stream", "inet-stream-tcp", "inet6-stream-flags"} {
		if !strings.Contains(string(out), name+" "+ipprotoTCP+"\n") {
			t.Errorf("with MPTCP off, %s: %s, want a TCP socket", name, out)
		}
	}
}
