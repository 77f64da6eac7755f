package agent

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// A rule's datapath id never moves while its name is in the node state, nor
// while a live connection uses it after the name left; a new name takes the
// lowest id neither held nor in use; the table survives a restart.
func TestRuleIDsNeverMoveWhileUsed(t *testing.T) {
	dir := t.TempDir()
	tbl, found := readRuleIDs(dir)
	if found {
		t.Fatal("a table in an empty state directory")
	}
	step := func(want []string, inUse ...uint32) map[string]uint32 {
		t.Helper()
		live := map[uint32]bool{}
		for _, id := range inUse {
			live[id] = true
		}
		ids, err := tbl.assign(want, nil, live)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	if ids := step([]string{"spread-1"}); ids["spread-1"] != 0 {
		t.Fatalf("first rule got %v", ids)
	}
	// A policy whose name sorts first arrives: nothing moves.
	if ids := step([]string{"aaa-1", "spread-1"}); ids["spread-1"] != 0 || ids["aaa-1"] != 1 {
		t.Fatalf("after a rule sorting first: %v, want spread-1 kept on 0", ids)
	}
	// spread-1 leaves the node state while a connection still uses it.
	if freed := tbl.retire(map[string]bool{"aaa-1": true}, map[uint32]bool{0: true}); len(freed) != 0 {
		t.Fatalf("an id in use was freed: %v", freed)
	}
	if ids := step([]string{"aaa-1", "spread-2"}, 0); ids["spread-2"] != 2 {
		t.Fatalf("a new rule took %v while 0 is held by a retired rule in use and 1 by aaa-1", ids)
	}
	if err := tbl.write(dir); err != nil {
		t.Fatal(err)
	}
	// A restart reads the same table.
	tbl, found = readRuleIDs(dir)
	if !found || !maps.Equal(tbl.ByName, map[string]uint32{"aaa-1": 1, "spread-1": 0, "spread-2": 2}) {
		t.Fatalf("table after a restart: %v (found %v)", tbl.ByName, found)
	}
	// The connection ended: the id is freed, and reused.
	if freed := tbl.retire(map[string]bool{"aaa-1": true, "spread-2": true}, nil); !slices.Equal(freed, []uint32{0}) {
		t.Fatalf("freed %v, want [0]", freed)
	}
	if ids := step([]string{"aaa-1", "spread-2", "web-1"}); ids["web-1"] != 0 {
		t.Fatalf("a new rule after the id was freed: %v", ids)
	}
	// An id a live entry uses but no name holds (pinned by an earlier
	// process) is not given away either.
	if ids := step([]string{"aaa-1", "spread-2", "web-1", "db-1"}, 3); ids["db-1"] != 4 {
		t.Fatalf("a new rule took %v while 3 is in use", ids)
	}
}

// A table that is new takes the ids the pinned datapath already uses for a
// name (an upgrade from a release without a table), and runs out with an
// error naming the rules it could not place.
func TestRuleIDsAdoptAndRunOut(t *testing.T) {
	tbl, _ := readRuleIDs(t.TempDir())
	ids, err := tbl.assign([]string{"x", "y"}, map[string]uint32{"x": 7, "gone": 3}, nil)
	if err != nil || ids["x"] != 7 || ids["y"] != 0 || len(tbl.ByName) != 2 {
		t.Fatalf("adopted %v (%v), table %v: want x on 7, y on 0, nothing for a name not wanted", ids, err, tbl.ByName)
	}
	var many []string
	for i := range datapath.MaxRules + 1 {
		many = append(many, fmt.Sprintf("r%03d", i))
	}
	tbl, _ = readRuleIDs(t.TempDir())
	if _, err := tbl.assign(many, nil, nil); err == nil || !strings.Contains(err.Error(), "r256") {
		t.Fatalf("257 rules: %v, want an error naming r256", err)
	}
}

// TestRetiredRulesInUseCountAgainstTheTable: a tenant that cycles its
// preferred paths while keeping a connection per variant alive holds every
// id but one with rules no pod uses any more. The translation counts them:
// the pod whose rule takes the last id is enforced, the next one that needs
// an id is skipped (RuleTableFull), and the id assignment of the plan
// cannot fail, which would fail the whole node's reconcile (and leave every
// pod of it ungated).
func TestRetiredRulesInUseCountAgainstTheTable(t *testing.T) {
	tbl := newRuleIDs()
	live := map[uint32]bool{}
	for i := range datapath.MaxRules - 2 {
		tbl.ByName[fmt.Sprintf("tenant-c-variant-%03d", i)] = uint32(i)
		live[uint32(i)] = true
	}
	// An id a live connection uses that no name holds (its name was
	// lost): taken too.
	live[uint32(datapath.MaxRules-2)] = true
	prior := priorOf(tbl, live)
	if prior.HeldIDs != 1 || len(prior.HeldRules) != datapath.MaxRules-2 {
		t.Fatalf("prior: %d names, %d unnamed ids", len(prior.HeldRules), prior.HeldIDs)
	}
	tr := FromNodeState(NodeDefaults("n1"), nodeState(twoPaths(),
		podIn("tenant-a", "web", "10.244.1.10", spread(1)),
		podIn("tenant-b", "api", "10.244.1.11", policyRule("api")),
	), nil, testLinks, locateAll, prior)
	if len(tr.Errors) != 0 {
		t.Fatal(tr.Errors)
	}
	if len(tr.PodProblems) != 1 || tr.PodProblems[0].Name != "api" || tr.PodProblems[0].Reason != mptcpv1alpha1.PodRuleTableFull {
		t.Fatalf("pod problems %+v, want tenant-b/api skipped for a full rule table", tr.PodProblems)
	}
	if len(tr.Plan.Pods) != 1 || tr.Plan.Pods[0].Ref.Name != "web" {
		t.Fatalf("plan pods %+v, want tenant-a/web", tr.Plan.Pods)
	}
	var want []string
	for _, r := range tr.Plan.Rules {
		want = append(want, r.Name)
	}
	ids, err := tbl.assign(want, nil, live)
	if err != nil {
		t.Fatalf("the plan's rules got no ids: %v", err)
	}
	if id := ids[want[0]]; id != uint32(datapath.MaxRules-1) {
		t.Errorf("%s got id %d, want the last free one", want[0], id)
	}
}
