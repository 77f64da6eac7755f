package agent

import (
	"fmt"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// A peer keeps its slot while it is probed, a newcomer takes the slot a
// leaver freed, no two peers share one, and peers beyond the slots get 0.
func TestPeerSlotsAreStableAndReused(t *testing.T) {
	var s peerSlots
	first := s.assign([]string{"b", "a", "c"})
	if first["a"] != 1 || first["b"] != 2 || first["c"] != 3 {
		t.Fatalf("slots %v, want a 1, b 2, c 3 (by name)", first)
	}
	second := s.assign([]string{"c", "a", "d"})
	if second["a"] != 1 || second["c"] != 3 || second["d"] != 2 || len(second) != 3 {
		t.Fatalf("after b left and d came: %v, want a 1, c 3, d in b's slot 2", second)
	}

	var many []string
	for i := range limits.ProbedPeers + 5 {
		many = append(many, fmt.Sprintf("node%05d", i))
	}
	all := s.assign(many)
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
