package observe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/agentapi"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	privileged "github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// getUnix sends GET path over the unix socket at sock, as root (this test).
func getUnix(t *testing.T, sock, path string) (int, []byte) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	resp, err := c.Get("http://agent" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// asNobody runs curl against sock as uid/gid 65534 with no supplementary
// groups and no capabilities, and returns curl's exit status and output.
func asNobody(t *testing.T, sock, path string) (int, string) {
	t.Helper()
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
		"curl", "-sS", "--max-time", "5", "-w", "\nHTTP %{http_code}", "--unix-socket", sock, "http://agent"+path)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

func localAPISource(t *testing.T) *source {
	t.Helper()
	privileged.RequireRoot(t, "setpriv", "curl")
	dp, err := datapath.Load(datapath.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	return &source{dp: dp}
}

// The socket is root's alone (0600 in a 0700 directory): root gets JSON,
// another user cannot even connect.
func TestLocalAPISocketIsRootOnly(t *testing.T) {
	src := localAPISource(t)
	ctx, cancel := context.WithCancel(context.Background())
	sock, wait, err := ServeLocalAPI(ctx, src, t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer wait()
	defer cancel()
	st, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 || st.Mode()&os.ModeSocket == 0 {
		t.Errorf("socket mode %v, want a socket with 0600", st.Mode())
	}
	for _, path := range []string{"/v1/subflows", "/v1/connections"} {
		code, body := getUnix(t, sock, path)
		var list []json.RawMessage
		if code != http.StatusOK || json.Unmarshal(body, &list) != nil {
			t.Errorf("root GET %s: %d %s, want 200 and a JSON list", path, code, body)
		}
	}
	// curl exits 7 when it cannot connect: EACCES on the socket.
	if code, out := asNobody(t, sock, "/v1/subflows"); code != 7 {
		t.Errorf("nobody reached the 0600 socket: curl exit %d: %s", code, out)
	}
}

// Even on a socket anyone could open, the peer-credential check refuses a
// client that is not uid 0 with 403 and serves root.
func TestLocalAPIRefusesNonRootPeers(t *testing.T) {
	src := localAPISource(t)
	dir := filepath.Join("/tmp", "mptcp-localapi-"+strings.ReplaceAll(t.Name(), "/", "-"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sock, wait, err := serveLocalAPI(ctx, src, slog.New(slog.DiscardHandler), filepath.Join(dir, "open.sock"), 0o666)
	if err != nil {
		t.Fatal(err)
	}
	defer wait()
	defer cancel()
	code, out := asNobody(t, sock, "/v1/connections")
	if code != 0 || !strings.HasSuffix(out, "HTTP 403") || !strings.Contains(out, "only root") {
		t.Errorf("nobody on an open socket: curl exit %d: %q, want HTTP 403 with the reason", code, out)
	}
	if code, body := getUnix(t, sock, "/v1/connections"); code != http.StatusOK {
		t.Errorf("root on the same socket: %d %s", code, body)
	}
}

// A pod's report names the pod, says whether the agent configures it, and
// for one it configures carries its namespace's MPTCP counters; a client of
// LocalAPIGet gets the same JSON, and a path the API lacks is an error that
// says so.
func TestLocalAPIPodReport(t *testing.T) {
	src := localAPISource(t)
	// The test's own network namespace stands in for the pod's.
	src.pods = []podnet.Pod{{Name: "tenant.web-0", NetNS: "/proc/self/ns/net", IPs: []netip.Addr{netip.MustParseAddr("10.1.1.10")}}}
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	_, wait, err := ServeLocalAPI(ctx, src, dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer wait()
	defer cancel()
	get := func(path string) agentapi.PodReport {
		t.Helper()
		var buf bytes.Buffer
		if err := LocalAPIGet(ctx, dir, path, &buf); err != nil {
			t.Fatal(err)
		}
		var r agentapi.PodReport
		if err := json.Unmarshal(buf.Bytes(), &r); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, buf.String())
		}
		return r
	}
	if r := get("/v1/pods/tenant/web-0"); !r.Configured || r.Namespace != "tenant" || r.Name != "web-0" || r.CountersError != "" ||
		len(r.Counters) == 0 || r.Connections == nil {
		t.Errorf("report of a configured pod: %+v, want it configured with its MPTcpExt counters and a (empty) connection list", r)
	}
	if _, ok := get("/v1/pods/tenant/web-0").Counters["MPCapableFallbackSYNACK"]; !ok {
		t.Error("the report lacks the counter explain reads for a peer that does not speak MPTCP (MPCapableFallbackSYNACK)")
	}
	if r := get("/v1/pods/tenant/web-1"); r.Configured || r.Counters != nil {
		t.Errorf("report of a pod the agent does not configure: %+v, want only its name", r)
	}
	err = LocalAPIGet(ctx, dir, "/v1/nothing", io.Discard)
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("GET of a path the API lacks: %v, want a 404 error", err)
	}
}
