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
// is forgotten; a path the plan keeps stays down, and so does one that waits
// for its link (its NIC removed, to be created again).
func TestAPathThatLeavesThePlanWhileDownIsBackForThePathManagersUnlessItAwaitsItsLink(t *testing.T) {
	a := &Agent{log: slog.New(slog.DiscardHandler), pms: podnet.NewPathManagers(slog.New(slog.DiscardHandler), podnet.PathManagerOptions{})}
	a.down = map[uint32]bool{1: true, 2: false, 3: true, 5: true}
	a.linkDown = map[uint32]bool{1: true, 2: false, 3: true, 5: true}
	a.pms.PathDown(1)
	a.pms.PathDown(3)
	a.pms.PathDown(5)
	a.forgetPathsLeft(&Plan{Paths: []PlanPath{{Path: routing.Path{Index: 3}}}, Awaiting: []AwaitingPath{{Name: "fabric-e", Index: 5, Away: true}}})
	for deadline := time.Now().Add(5 * time.Second); a.pms.Down(1); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("path 1 left the plan down and is still down for the path managers after 5 s")
		}
	}
	if !a.pms.Down(3) {
		t.Error("path 3, still in the plan, is no longer down for the path managers")
	}
	if !a.pms.Down(5) {
		t.Error("path 5, waiting for its link, is no longer down for the path managers")
	}
	a.downMu.Lock()
	defer a.downMu.Unlock()
	if _, ok := a.down[1]; ok || len(a.down) != 2 || !a.down[3] || !a.down[5] {
		t.Errorf("paths remembered down %v, want paths 3 and 5", a.down)
	}
}
