package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run under CI, where nothing may be skipped.
func InCI() bool { return os.Getenv("CI") == "true" }

// Unavailable fails the test under CI and skips it elsewhere, saying why.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("prerequisite missing under CI: %s", msg)
	}
	t.Skipf("skipping: %s (run as root with the tools from .ci/run installed)", msg)
}

// RequireRoot needs euid 0 (BPF, network namespaces) and the named tools.
func RequireRoot(t testing.TB, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root for BPF and network namespaces")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			Unavailable(t, "needs %s on PATH", tool)
		}
	}
}
