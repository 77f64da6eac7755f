package testutil

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// BuiltTool returns the path of a tool the Makefile builds into the cache and
// names in the environment variable env (HELM, IMAGEBUILD): `make test`
// sets them. Without it the test is skipped, or fails under CI, saying
// which make target builds the tool.
func BuiltTool(t testing.TB, env, target string) string {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		Unavailable(t, "%s is not set: `make %s` builds it (`make test` sets %s)", env, target, env)
	}
	if _, err := os.Stat(path); err != nil {
		Unavailable(t, "%s=%s: %v: `make %s` builds it", env, path, err, target)
	}
	return path
}

// CompileC builds the C source src with clang into out (-O2 -Wall and
// flags), for tests of what the preload library serves. Without clang the
// test is skipped, or fails under CI.
func CompileC(t testing.TB, src, out string, flags ...string) {
	t.Helper()
	if _, err := exec.LookPath("clang"); err != nil {
		Unavailable(t, "needs clang (make deps): %v", err)
	}
	args := append([]string{"-O2", "-Wall", "-o", out, src}, flags...)
	if b, err := exec.Command("clang", args...).CombinedOutput(); err != nil {
		t.Fatalf("clang %s: %v\n%s", strings.Join(args, " "), err, b)
	}
}
