package framework

import (
	"slices"
	"testing"
)

// Only a reset its sender sent after its own FIN on the same 4-tuple is a
// teardown's: one before the FIN, one from the other end, or one on a
// 4-tuple with no FIN is not.
func TestSplitTeardownKeepsOnlyResetsAfterTheirSendersFIN(t *testing.T) {
	fins := map[string]float64{"10.0.0.2 5601 10.0.0.1 40000": 100.5}
	after := "node 1 nic1: 100.6 10.0.0.2 5601 10.0.0.1 40000 ·······A·R·· 7 0"
	before := "node 1 nic1: 100.4 10.0.0.2 5601 10.0.0.1 40000 ·········R·· 7 0"
	otherEnd := "node 1 nic1: 100.7 10.0.0.1 40000 10.0.0.2 5601 ·········R·· 9 0"
	noFIN := "node 1 nic2: 100.8 10.0.0.2 5601 10.0.0.1 40001 ·········R·· 9 0"
	teardown, other := splitTeardown(fins, []string{after, before, otherEnd, noFIN, "garbage"})
	if !slices.Equal(teardown, []string{after}) {
		t.Errorf("teardown %q, want only the reset after its sender's FIN", teardown)
	}
	if !slices.Equal(other, []string{before, otherEnd, noFIN, "garbage"}) {
		t.Errorf("other %q, want the rest", other)
	}
}
