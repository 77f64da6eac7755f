package linkwatch

import (
	"testing"
	"time"
)

// A link that loses its carrier fewer times than the threshold within the
// window is used as soon as it is back; one more loss holds it down until
// it has been back for the hold, and a loss during the hold starts it
// again from the return.
func TestFlappingLinkIsHeldDownAfterTheThreshold(t *testing.T) {
	d := NewDamper(Damping{Transitions: 3, Window: time.Minute, Hold: 10 * time.Second})
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	step := func(s float64, up, wantUsable bool) {
		t.Helper()
		usable, until := d.Observe("nic1", up, at(s))
		if usable != wantUsable {
			t.Fatalf("at %vs, link up=%v: usable %v, want %v", s, up, usable, wantUsable)
		}
		if held := up && !usable; held != !until.IsZero() {
			t.Fatalf("at %vs: held %v but hold end %v", s, held, until)
		}
	}
	step(0, true, true)
	step(1, false, false)
	step(2, true, true) // one loss
	step(3, false, false)
	step(4, true, true) // two
	step(5, false, false)
	step(6, true, false) // three within the window: held until 16
	if !d.Held("nic1", at(15)) {
		t.Error("not held 9 s after the return")
	}
	step(15.9, true, false)
	step(16.1, true, true)

	// Losses older than the window no longer count.
	step(100, false, false)
	step(101, true, true)

	// Another link has a history of its own.
	if usable, _ := d.Observe("nic2", true, at(6)); !usable {
		t.Error("nic2 held down by nic1's flaps")
	}
}

func TestDampingOffPassesTheLinkThrough(t *testing.T) {
	d := NewDamper(Damping{})
	t0 := time.Unix(1000, 0)
	for i := range 10 {
		up := i%2 == 0
		if usable, until := d.Observe("nic1", up, t0.Add(time.Duration(i)*time.Millisecond)); usable != up || !until.IsZero() {
			t.Fatalf("transition %d: usable %v (hold end %v), want %v", i, usable, until, up)
		}
	}
}
