package agent

import (
	"fmt"
	"slices"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// A peer keeps its slot while it is probed, a newcomer takes the slot a
// leaver freed, no two peers share one, and peers beyond the slots get 0.
func TestPeerSlotsAreStableAndReused(t *testing.T) {
	var s peerSlots
	first, fresh := s.assign([]string{"b", "a", "c"})
	if first["a"] != 1 || first["b"] != 2 || first["c"] != 3 || len(fresh) != 3 {
		t.Fatalf("slots %v, fresh %v; want a 1, b 2, c 3 (by name), all fresh", first, fresh)
	}
	second, fresh := s.assign([]string{"c", "a", "d"})
	if second["a"] != 1 || second["c"] != 3 || second["d"] != 2 || len(second) != 3 || !slices.Equal(fresh, []string{"d"}) {
		t.Fatalf("after b left and d came: %v, fresh %v; want a 1, c 3, d in b's slot 2, d fresh", second, fresh)
	}

	var many []string
	for i := range limits.ProbedPeers + 5 {
		many = append(many, fmt.Sprintf("node%05d", i))
	}
	all, _ := s.assign(many)
	seen := map[uint32]string{}
	for node, slot := range all {
		if slot == 0 || slot > limits.ProbedPeers {
			t.Fatalf("%s has slot %d", node, slot)
		}
		if other, dup := seen[slot]; dup {
			t.Fatalf("%s and %s share slot %d", node, other, slot)
		}
		seen[slot] = node
	}
	if len(all) != limits.ProbedPeers {
		t.Fatalf("%d peers of %d have a slot, want %d", len(all), len(many), limits.ProbedPeers)
	}
}
