package podnet

import (
	"testing"
	"time"
)

// The first skipped message is logged, then at most one a logLimitEvery,
// saying how many were held back.
func TestLogLimiterLetsOneLineThroughPerInterval(t *testing.T) {
	var l logLimiter
	t0 := time.Unix(1000, 0)
	type step struct {
		at         time.Duration
		ok         bool
		suppressed int
	}
	for i, s := range []step{
		{0, true, 0},
		{time.Second, false, 0},
		{2 * time.Second, false, 0},
		{9 * time.Second, false, 0},
		{10 * time.Second, true, 3},
		{11 * time.Second, false, 0},
		{time.Minute, true, 1},
		{2 * time.Minute, true, 0},
	} {
		ok, n := l.allow(t0.Add(s.at))
		if ok != s.ok || n != s.suppressed {
			t.Errorf("line %d at %v: allowed %v with %d held back, want %v with %d", i, s.at, ok, n, s.ok, s.suppressed)
		}
	}
}
