package testutil

import (
	"testing"
	"time"
)

// Eventually calls check every interval until it returns nil, and fails the
// test with what and check's last error once within has passed. check runs
// at least once, and once more at the deadline.
//
// It is a plain loop rather than apimachinery's wait.Poll*: that would link
// klog and apimachinery's runtime into every test binary that imports this
// package, the BPF and bench ones included, for the same few lines.
func Eventually(t testing.TB, within, interval time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if !time.Now().Before(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(interval)
	}
}
