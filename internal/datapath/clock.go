package datapath

import (
	"time"

	"golang.org/x/sys/unix"
)

// The programs' timestamps (a subflow's CreatedNs, its seen and moved
// times) are bpf_ktime_get_ns: CLOCK_MONOTONIC in nanoseconds.

// ktimeNow is the programs' clock now.
func ktimeNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail on Linux
	return uint64(ts.Nano())
}

// ktimeOf is t on the programs' clock (0 for a time before the clock's
// start).
func ktimeOf(t time.Time) uint64 {
	now, since := ktimeNow(), time.Since(t)
	if since > 0 && uint64(since) > now {
		return 0
	}
	return uint64(int64(now) - int64(since))
}

// KtimeToTime is the wall-clock time of a programs' timestamp.
func KtimeToTime(ns uint64) time.Time {
	return time.Now().Add(-time.Duration(ktimeNow() - ns))
}
