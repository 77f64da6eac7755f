package testbed

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// LibcClientSource is the C client that knows nothing of MPTCP, the
// workload of the preload library's benchmarks and of the libc-client
// image (hack/tools/imagebuild).
var LibcClientSource = filepath.Join(testenv.RepoRoot(), "hack", "libc-client", "libc-client.c")

// BuildLibcClient compiles LibcClientSource with clang into dir, as the
// image builder does, and returns the program's path.
func BuildLibcClient(t testing.TB, dir string) string {
	t.Helper()
	prog := filepath.Join(dir, "libc-client")
	testutil.CompileC(t, LibcClientSource, prog)
	return prog
}

// libcClientBlock is the period of the C client's byte pattern.
const libcClientBlock = 1 << 16

// LibcClientReports reads the JSON lines the C client prints, one per
// connection, and gives each the SHA-256 of what it wrote: byte i of
// every stream is (i*131+7) mod 256 over a 64 KiB period, so the count
// is enough.
func LibcClientReports(out []byte) ([]SenderReport, error) {
	var pattern [libcClientBlock]byte
	for i := range pattern {
		pattern[i] = byte(i*131 + 7)
	}
	var reps []SenderReport
	for line := range bytes.Lines(out) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r SenderReport
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("libc-client printed %q: %w", line, err)
		}
		h := sha256.New()
		for left := r.Bytes; left > 0; left -= libcClientBlock {
			h.Write(pattern[:min(left, libcClientBlock)])
		}
		r.SHA256 = hex.EncodeToString(h.Sum(nil))
		reps = append(reps, r)
	}
	return reps, nil
}
