package testutil

import (
	"os"
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
