package testbed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// BedTools are the programs a bed needs on the machine.
var BedTools = []string{"ip", "tc", "sysctl", "sh", "mountpoint"}

// CaptureTools are the programs StartCaptures and Analyze need.
var CaptureTools = []string{"dumpcap", "tshark", "mergecap"}

// Unavailable tells a test that the machine cannot run it: t.Fatal when
// CI=true (a CI machine must be able to), and t.Skip with the reason otherwise.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	testutil.Unavailable(t, "the test bed cannot run here: "+format, args...)
}

// RequireRoot and RequireTools call Unavailable unless the process is root and the tools are on PATH.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root (network namespaces, tc, bpffs)")
	}
}

func RequireTools(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			Unavailable(t, "needs %s on PATH", tool)
		}
	}
}

// NewForTest builds a bed for a test and registers Down with t.Cleanup, so the bed is removed whether the test
// passes or fails. It first removes the leftovers of crashed runs (SweepStale), then builds the bed (a fresh
// unique prefix when cfg.Name is empty).
func NewForTest(t testing.TB, cfg Config) *Bed {
	t.Helper()
	RequireRoot(t)
	RequireTools(t, BedTools...)
	if err := SweepStale(); err != nil {
		t.Logf("sweeping stale beds: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	b, err := Up(ctx, cfg)
	if err != nil {
		t.Fatalf("bringing the test bed up: %v", err)
	}
	t.Cleanup(func() {
		start := time.Now()
		if err := b.Down(); err != nil {
			t.Errorf("tearing the test bed %s down: %v", b.Name, err)
		}
		t.Logf("test bed %s down in %v", b.Name, time.Since(start).Round(time.Millisecond))
	})
	t.Logf("test bed %s: %d nodes x %d NICs x %d pods, link rate %q, up in %v", b.Name, cfg.Nodes, cfg.NICs, cfg.PodsPerNode, cfg.LinkRate,
		time.Since(start).Round(time.Millisecond))
	return b
}

// BuildTraffic builds hack/traffic into a temporary directory of the test and returns the binary's path.
func BuildTraffic(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "traffic")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/mptcp-operator/mptcp-operator/hack/traffic")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building hack/traffic: %v\n%s", err, out)
	}
	return bin
}

// Must fails the test on err; for the bed's setup calls in tests.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// String renders a pod for messages.
func (p *Pod) String() string { return fmt.Sprintf("pod %s (%s)", p.Name, p.Addr) }
