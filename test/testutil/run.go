package testutil

import (
	"os/exec"
	"testing"
)

// Run runs the command args (the program, then its arguments) and fails the
// test with its combined output if it does not succeed.
func Run(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v: %s", args, err, out)
	}
}
