package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// A rule reaches the datapath under an id (0..datapath.MaxRules-1): the
// index of its entry in the rules and rate_rules maps, stored with every
// subflow and connection it placed, which keep acting under it. So an id
// must never move while a live entry uses it, or a connection would take
// another rule's caps, paths and limits. The agent keeps a table from rule
// names (the node state's identities: a policy's name, and for a variant
// '@' and a hash of what makes it one; compile.RuleName) to ids, in its state directory so that a restart keeps it:
// a name keeps its id for as long as the node state lists it; a name the
// node state drops keeps its id, and its datapath entries, while live
// entries still use them; only then is the id free for another name.
//
// Pods have ids the same way, in a table of their own (podids.go): a
// pod's shaping classes are numbered by its id, not by its place among the
// node's pods, so that a pod another tenant adds moves no class.
const ruleIDsFile = "rule-ids.json"

// idTable maps names to ids 0..size-1 that do not move while the name is
// wanted or a live entry uses the id (ruleIDs, podIDs). Only ByName is kept
// in the file.
type idTable struct {
	ByName map[string]uint32 `json:"byName"`
	// file is the table's in the state directory; size the number of
	// ids; what and heldBy name the ids and their holders in errors.
	file, what, heldBy string
	size               uint32
}

// ruleIDs is the rules' table.
type ruleIDs = idTable

func newRuleIDs() *idTable {
	return &idTable{ByName: map[string]uint32{}, file: ruleIDsFile, size: uint32(datapath.MaxRules),
		what: "rule", heldBy: "the node's rules and by rules live connections still use"}
}

func readRuleIDs(stateDir string) (*idTable, bool) { return newRuleIDs().read(stateDir) }

// read fills an empty table from its file in stateDir, and says whether
// there was one.
func (t *idTable) read(stateDir string) (*idTable, bool) {
	b, err := os.ReadFile(filepath.Join(stateDir, t.file))
	if err != nil {
		return t, false
	}
	// A damaged table is rebuilt (the rules': from the datapath, adopt).
	var stored struct {
		ByName map[string]uint32 `json:"byName"`
	}
	if json.Unmarshal(b, &stored) != nil || stored.ByName == nil {
		return t, false
	}
	for name, id := range stored.ByName {
		if id < t.size {
			t.ByName[name] = id
		}
	}
	return t, true
}

func (t *idTable) write(stateDir string) error {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	tmp := filepath.Join(stateDir, "."+t.file)
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(stateDir, t.file))
}

// names lists the table by id.
func (t *idTable) names() map[uint32]string {
	out := make(map[uint32]string, len(t.ByName))
	for name, id := range t.ByName {
		out[id] = name
	}
	return out
}

// assign gives every name of want an id: the one it has; else, for a table
// that is new (the first start of a release that keeps one), the id the
// datapath already gives it (adopt: for rules, the position of the name in
// a pod's selector chain, as pinned by the previous process); else the
// lowest id no name holds and no live entry uses (inUse). Names it cannot
// place (every id taken) are returned with the error.
func (t *idTable) assign(want []string, adopt map[string]uint32, inUse map[uint32]bool) (map[string]uint32, error) {
	held := map[uint32]string{}
	for name, id := range t.ByName {
		held[id] = name
	}
	for _, name := range slices.Sorted(maps.Keys(adopt)) {
		id := adopt[name]
		if _, has := t.ByName[name]; has || !slices.Contains(want, name) || held[id] != "" || id >= t.size {
			continue
		}
		t.ByName[name], held[id] = id, name
	}
	out := map[string]uint32{}
	var full []string
	next := uint32(0)
	for _, name := range want {
		if id, ok := t.ByName[name]; ok {
			out[name] = id
			continue
		}
		for next < t.size && (held[next] != "" || inUse[next]) {
			next++
		}
		if next == t.size {
			full = append(full, name)
			continue
		}
		t.ByName[name], held[next], out[name] = next, name, next
	}
	if len(full) > 0 {
		return out, fmt.Errorf("no %s id left for %v: %d ids are held by %s", t.what, full, t.size, t.heldBy)
	}
	return out, nil
}

// retire drops the names not wanted whose ids no live entry uses, and
// returns those ids, for the caller to clear.
func (t *idTable) retire(want map[string]bool, inUse map[uint32]bool) []uint32 {
	var freed []uint32
	for _, name := range slices.Sorted(maps.Keys(t.ByName)) {
		id := t.ByName[name]
		if want[name] || inUse[id] {
			continue
		}
		delete(t.ByName, name)
		freed = append(freed, id)
	}
	return freed
}

// liveRuleIDs are the rule ids the datapath's subflows and connections
// still carry.
func liveRuleIDs(dp *datapath.Datapath) (map[uint32]bool, error) {
	sfs, err := dp.Subflows()
	if err != nil {
		return nil, err
	}
	conns, err := dp.Connections()
	if err != nil {
		return nil, err
	}
	out := map[uint32]bool{}
	for _, sf := range sfs {
		if sf.Rule != datapath.NoRule {
			out[sf.Rule] = true
		}
	}
	for _, c := range conns {
		out[c.Rule] = true
	}
	return out, nil
}

// adoptedRuleIDs reads, from the pinned endpoints, the ids a previous agent
// gave the rules of cfg's pods: the id at each position of a pod's chain is
// the rule named at the same position now, when the chains have the same
// length. An upgrade from a release without a table keeps live connections
// under the rules they started with.
func adoptedRuleIDs(dp *datapath.Datapath, plan *Plan) map[string]uint32 {
	chains, err := dp.EndpointRules()
	if err != nil {
		return nil
	}
	out := map[string]uint32{}
	for _, pod := range plan.Pods {
		names := pod.Rules
		for _, ip := range pod.IPs {
			ids := chains[ip.Unmap()]
			if len(ids) != len(names) {
				continue
			}
			for i, name := range names {
				if _, taken := out[name]; !taken {
					out[name] = ids[i]
				}
			}
		}
	}
	return out
}

// sweepRetiredRules forgets the datapath's records of closed subflows and
// connections that carry a rule id no name of plan holds, on its pods (a
// released pod's records are swept with it, sweepReleased), so that an id a
// connection no longer needs is freed. A subflow is closed when no TCP
// socket of its pod's namespace has its 4-tuple; a connection when none of
// its subflows is left.
func (a *Agent) sweepRetiredRules(plan *Plan, current map[uint32]bool, view *sweepView) error {
	sfs, err := view.Subflows()
	if err != nil {
		return err
	}
	conns, err := a.dp.Connections()
	if err != nil {
		return err
	}
	netnsOf := map[netip.Addr]string{}
	for _, pod := range plan.Pods {
		for _, ip := range pod.IPs {
			netnsOf[ip.Unmap()] = pod.NetNS
		}
	}
	retired := func(id uint32) bool { return id != datapath.NoRule && !current[id] }
	forgot := false
	defer func() {
		if forgot {
			view.changed()
		}
	}()
	var errs []error
	left := map[uint32]bool{} // tokens of connections with a subflow left
	// A subflow an earlier release recorded does not name its connection
	// (conn 0): while one is left, every connection of its pod address is
	// kept.
	unnamed := map[netip.Addr]bool{}
	keep := func(sf datapath.Subflow) {
		left[sf.Conn] = true
		if sf.Conn == 0 {
			unnamed[sf.Local.Addr().Unmap()] = true
		}
	}
	for _, sf := range sfs {
		ns, ours := netnsOf[sf.Local.Addr()]
		if !retired(sf.Rule) || !ours {
			keep(sf)
			continue
		}
		// A namespace that cannot be listed keeps its subflows: the
		// pod's problem (sweepView), not the node's.
		socks, err := view.Sockets(ns)
		if err != nil || socks[socketKey{sf.Local, sf.Remote}] {
			keep(sf)
			continue
		}
		if err := a.dp.ForgetSubflow(sf.Local, sf.Remote); err != nil {
			errs = append(errs, err)
			keep(sf)
			continue
		}
		forgot = true
	}
	for _, c := range conns {
		if _, ours := netnsOf[c.Local]; !retired(c.Rule) || !ours || left[c.Token] || unnamed[c.Local.Unmap()] {
			continue
		}
		if err := a.dp.ForgetConnection(c.Local, c.Token); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
