package kernels

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/guest"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// AssetsEnv lists the kernels' directories (hack/guest-assets.sh fills
// each), separated by spaces; `make test-kernels` sets it.
const AssetsEnv = "MPTCP_KERNEL_ASSETS"

// claim is what the project says of a kernel line (docs/install.md's
// matrix): every step passes, or, below the floor, the step that fails and
// what its error names.
type claim struct {
	fails  string
	naming []string
}

var claims = map[string]claim{
	"6.12": {},
	"6.1":  {fails: Kernel, naming: []string{"KernelTooOld", "Linux 6.1.", "older than 6.6"}},
}

// TestKernels boots each kernel of the matrix in a guest under QEMU and runs
// kernelcheck there: on a supported kernel the datapath passes the kernel's
// own verifier, its TCX links attach and the socket program loads; below
// the floor the step that cannot work fails with an error that says which.
func TestKernels(t *testing.T) {
	dirs := strings.Fields(os.Getenv(AssetsEnv))
	if len(dirs) == 0 {
		testutil.Unavailable(t, "%s is not set: `make test-kernels` fetches the matrix's kernels and sets it", AssetsEnv)
	}
	testbed.RequireTools(t, "qemu-system-x86_64")
	accel, err := guest.AccelFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 1, PodsPerNode: len(dirs)})
	seen := map[string]bool{}
	for i, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			img, err := guest.BuildImage(dir, t.TempDir(), map[string]string{"bin/kernelcheck": "github.com/mptcp-operator/mptcp-operator/test/kernels/kernelcheck"})
			if err != nil {
				t.Fatal(err)
			}
			g := bed.BootImageForTest(t, bed.Nodes[0].Pods[i], testbed.BridgeBinding, img, accel)
			defer g.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			out, err := g.Run(ctx, "/bin/kernelcheck")
			if err != nil {
				t.Fatalf("kernelcheck: %v\n%s", err, out)
			}
			steps := map[string]Step{}
			var order []string
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				var s Step
				if err := json.Unmarshal([]byte(line), &s); err != nil {
					t.Fatalf("kernelcheck printed %q: %v", line, err)
				}
				steps[s.Name], order = s, append(order, s.Name)
				t.Logf("%s: ok=%v %s%s", s.Name, s.OK, s.Detail, s.Error)
			}
			line := kernelLine(steps[Release].Detail)
			c, ok := claims[line]
			if !ok {
				t.Fatalf("kernel %q: no claim for its line %q in the matrix", steps[Release].Detail, line)
			}
			seen[line] = true
			for _, name := range []string{Kernel, BTF, BPFFS, Verifier, TCX, SocketProgram} {
				s, ran := steps[name]
				switch {
				case name == c.fails:
					if !ran || s.OK {
						t.Fatalf("%s: want it to fail on %s, below the floor; the steps: %v", name, line, order)
					}
					for _, want := range c.naming {
						if !strings.Contains(s.Error, want) {
							t.Errorf("%s's error %q does not name %q", name, s.Error, want)
						}
					}
					return
				case !ran || !s.OK:
					t.Fatalf("%s on %s: %s (ran: %v)", name, line, s.Error, ran)
				}
			}
		})
	}
	for line := range claims {
		if !seen[line] {
			t.Errorf("the matrix claims kernel %s, which %s does not hold", line, AssetsEnv)
		}
	}
}

// kernelLine is a release's major.minor: "6.12.117+deb12-cloud-amd64" is 6.12.
func kernelLine(release string) string {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return release
	}
	return parts[0] + "." + parts[1]
}
