package agent

import (
	"log/slog"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/routing"
)

// A path that leaves the plan while it is down comes back for the path
// managers (the joins waiting for it are opened, on the plan's paths) and
// is forgotten; a path the plan keeps stays down.
func TestAPathThatLeavesThePlanWhileDownIsBackForThePathManagers(t *testing.T) {
	a := &Agent{log: slog.New(slog.DiscardHandler), pms: podnet.NewPathManagers(slog.New(slog.DiscardHandler), podnet.PathManagerOptions{})}
	a.down = map[uint32]bool{1: true, 2: false, 3: true}
	a.linkDown = map[uint32]bool{1: true, 2: false, 3: true}
	a.pms.PathDown(1)
	a.pms.PathDown(3)
	a.forgetPathsLeft(&Plan{Paths: []PlanPath{{Path: routing.Path{Index: 3}}}})
	for deadline := time.Now().Add(5 * time.Second); a.pms.Down(1); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("path 1 left the plan down and is still down for the path managers after 5 s")
		}
	}
	if !a.pms.Down(3) {
		t.Error("path 3, still in the plan, is no longer down for the path managers")
	}
	a.downMu.Lock()
	defer a.downMu.Unlock()
	if _, ok := a.down[1]; ok || len(a.down) != 1 || !a.down[3] {
		t.Errorf("paths remembered down %v, want only path 3", a.down)
	}
}
