package liveness

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// The loss verdict's rates, on seeded random loss (the figures in
// docs/agent.md, "Liveness"): a round-trip loss of 1 % never takes a peer
// down in eight hours of probes at 30 ms, one of 2 % seldom does; half the
// round trips lost (30 % each way) is found within a second and holds the
// peer down until it ends without a flap, and the peer is Up again within
// ClearRun ticks of the repair.
func TestLossVerdictRatesOnRandomLoss(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 2026))
	const hours8 = 1_000_000 // ticks of 30 ms
	for _, c := range []struct {
		loss     float64
		maxDowns uint64
	}{{0.01, 0}, {0.02, 20}} {
		r := newLossyRun()
		r.ticks(100, always)
		r.ticks(hours8, func(uint64) bool { return rng.Float64() >= c.loss })
		t.Logf("round-trip loss %.0f %%: %d downs in %d ticks", c.loss*100, r.t.downs, hours8)
		if r.t.downs > c.maxDowns {
			t.Errorf("round-trip loss %.0f %%: %d downs in %d ticks, want at most %d", c.loss*100, r.t.downs, hours8, c.maxDowns)
		}
	}

	var found, back []uint64
	flaps := 0
	for range 1000 {
		r := newLossyRun()
		r.ticks(100, always)
		from := r.seq + 1
		ch := r.ticks(100, func(uint64) bool { return rng.Float64() >= 0.51 })
		if len(ch) == 0 {
			t.Fatal("half the round trips lost for 100 ticks, and the peer stayed Up")
		}
		found = append(found, ch[0]-from+1)
		flaps += len(ch) - 1
		repair := r.seq + 1
		if ch = r.ticks(100, always); len(ch) != 1 || r.t.state != Up {
			t.Fatalf("after the repair: changes at %v, %v; want Up once", ch, r.t.state)
		}
		back = append(back, ch[0]-repair+1)
	}
	slices.Sort(found)
	slices.Sort(back)
	t.Logf("half the round trips lost, 1000 runs: found after %d/%d/%d ticks (min/median/max), Up again %d/%d/%d ticks after the repair; %d flaps",
		found[0], found[500], found[999], back[0], back[500], back[999], flaps)
	if found[999] > 33 || back[999] > ClearRun || flaps > 5 {
		t.Errorf("want found within 33 ticks (1 s), Up again within %d, at most 5 flaps in 1000 runs", ClearRun)
	}
}
