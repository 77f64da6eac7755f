package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// Limits of the datapath's maps: package limits, which the API and the
// controller read too, and which TestLimitsAreTheCEnum checks against enum
// limit of bpf/include/common.h.
const (
	// MaxSubflows is the kernel's cap on a connection's subflows.
	MaxSubflows = limits.Subflows
	// MaxRules is how many rule ids the rules map holds (ids 0..MaxRules-1).
	MaxRules = limits.Rules
	// MaxPodRules is how many rules one pod's selector chain can hold.
	MaxPodRules = limits.PodRules
	// MaxPods is how many pod addresses the datapath can select (and count)
	// at once: MAX_PODS, the slots of pod_records.
	MaxPods = limits.Pods
	// MaxRulePorts is how many port ranges one rule's selector can hold.
	MaxRulePorts = limits.RulePorts
	// MaxRuleCIDRs is how many remote CIDRs one rule's selector can hold.
	MaxRuleCIDRs = limits.RuleCIDRs
	// MaxWeight is the largest weight of a path (a byte in the map).
	MaxWeight = limits.Weight
)

const (
	// ruleNone is RULE_NONE: a mirrored subflow no rule selected.
	ruleNone = ^uint32(0)
	// cidrKeyFixedBits is CIDR_KEY_FIXED_BITS: the rule id and family
	// before the address in an LPM key.
	cidrKeyFixedBits = 40
)

// SpreadMode is how a rule places a connection's initial subflow over its
// paths (enum spread_mode).
type SpreadMode uint8

const (
	// SpreadRoundRobin gives initial subflows the rule's paths in turn.
	SpreadRoundRobin SpreadMode = SpreadMode(datapathSpreadModeSPREAD_ROUND_ROBIN)
	// SpreadWeighted gives each path its weight's share of initial
	// subflows, exactly over every run of sum(weights) placements.
	SpreadWeighted SpreadMode = SpreadMode(datapathSpreadModeSPREAD_WEIGHTED)
	// SpreadPreferred puts initial subflows on the first usable path of the
	// list, and joins on the next usable ones in order.
	SpreadPreferred SpreadMode = SpreadMode(datapathSpreadModeSPREAD_PREFERRED)
)

func (m SpreadMode) String() string {
	switch m {
	case SpreadRoundRobin:
		return "roundRobin"
	case SpreadWeighted:
		return "weighted"
	case SpreadPreferred:
		return "preferred"
	}
	return fmt.Sprintf("spread-%d", uint8(m))
}

// Family restricts a rule to one IP family; FamilyAny selects both.
type Family uint8

const (
	FamilyAny  Family = 0
	FamilyIPv4 Family = 2  // AF_INET
	FamilyIPv6 Family = 10 // AF_INET6
)

// Match says which opening SYNs a rule selects. Joins of a connection the
// datapath knows never go through selection: they follow their connection's
// rule.
type Match uint8

const (
	// MatchInitial selects the MP_CAPABLE SYN that opens a connection.
	MatchInitial = Match(datapathRuleMatchMATCH_INITIAL)
	// MatchJoin selects an MP_JOIN SYN whose connection is not known (its
	// handshake was not seen, e.g. it started before the agent).
	MatchJoin = Match(datapathRuleMatchMATCH_JOIN)
	// MatchAll is the default (the zero value means the same).
	MatchAll = MatchInitial | MatchJoin
)

// PortRange is an inclusive range of service ports.
type PortRange struct{ First, Last uint16 }

// Rule is one compiled rule: a selector and the spread actor's data. The
// service port a selector compares is the destination port of the SYN that
// opens the subflow, on both nodes: the server's port.
type Rule struct {
	// Paths are path indexes in order of preference.
	Paths []uint32
	// Weights, for SpreadWeighted, one per path (1..MaxWeight). Empty
	// means every path weighs 1.
	Weights []uint32
	// Spread is the placement of initial subflows.
	Spread SpreadMode
	// Preferred is how many of Paths, from the first, a tenant prefers:
	// in every spread mode a connection's initial subflow takes the first
	// of them that is up, and Spread decides only when none is.
	Preferred int
	// Backup are backup path indexes: after the active Paths, they take a
	// connection's joins (flagged backup on their way into the pod, which
	// needs RewriteHeaders) and its first subflow only when no active
	// path is up.
	Backup []uint32
	// RewriteHeaders is the admin's opt-in to rewriting the pods' packet
	// headers (the backup actor's B bit and MP_PRIO, the block actor's
	// ADD_ADDR NOPs).
	RewriteHeaders bool
	// MaxSubflows caps a connection's subflows, the first included (0: no
	// cap): a peer's join beyond it is answered with MP_TCPRST. At 1,
	// ADD_ADDRs going into the rule's pods become NOPs.
	MaxSubflows uint32
	// Blocked are path indexes a peer's join may not arrive on: it is
	// answered with MP_TCPRST. Disjoint from Paths and Backup.
	Blocked []uint32
	// SharedRisk are groups of the rule's paths (of Paths and Backup)
	// that share a bottleneck or a failure, at least two paths each, a
	// path in one group at most: a connection's join goes to a path of a
	// group its subflows do not use yet first, and shares a group only
	// when no other path is free. Listed in the order of their first path
	// in Paths then Backup, each group's paths in that order (as RuleAt
	// reads them back).
	SharedRisk [][]uint32
	// Family, CIDRs (of the remote address), Ports and Match select the
	// traffic; zero values select everything.
	Family Family
	CIDRs  []netip.Prefix
	Ports  []PortRange
	Match  Match
}

// Validate says what is wrong with r, if anything.
func (r Rule) Validate() error {
	if err := r.validatePaths(); err != nil {
		return err
	}
	if err := r.validatePlacement(); err != nil {
		return err
	}
	return r.validateSelector()
}

// validatePaths checks the rule's paths, backup, blocked and shared-risk
// path indexes.
func (r Rule) validatePaths() error {
	if len(r.Paths) == 0 || len(r.Paths) > MaxPaths {
		return fmt.Errorf("%d paths, want 1 to %d", len(r.Paths), MaxPaths)
	}
	all := append(slices.Clone(r.Paths), r.Backup...)
	if len(all) > MaxPaths {
		return fmt.Errorf("%d paths and %d backup paths, at most %d in all", len(r.Paths), len(r.Backup), MaxPaths)
	}
	for i, p := range all {
		if !ValidPath(p) {
			return fmt.Errorf("path index %d out of range 1..%d", p, MaxPaths)
		}
		if slices.Contains(all[:i], p) {
			return fmt.Errorf("path index %d listed twice (paths and backup paths are disjoint)", p)
		}
	}
	for _, p := range r.Blocked {
		if !ValidPath(p) {
			return fmt.Errorf("blocked path index %d out of range 1..%d", p, MaxPaths)
		}
		if slices.Contains(all, p) {
			return fmt.Errorf("path index %d is both blocked and one of the rule's paths", p)
		}
	}
	grouped := map[uint32]bool{}
	for _, g := range r.SharedRisk {
		if len(g) < 2 {
			return fmt.Errorf("shared-risk group %v: at least two paths", g)
		}
		for _, p := range g {
			if !slices.Contains(all, p) {
				return fmt.Errorf("shared-risk group %v: path index %d is not one of the rule's paths", g, p)
			}
			if grouped[p] {
				return fmt.Errorf("path index %d is in two shared-risk groups", p)
			}
			grouped[p] = true
		}
	}
	return nil
}

// validatePlacement checks how the rule places subflows: preferred paths,
// the subflow cap, backup's opt-in, the spread mode and its weights.
func (r Rule) validatePlacement() error {
	if r.Preferred < 0 || r.Preferred > len(r.Paths) {
		return fmt.Errorf("%d preferred paths of %d", r.Preferred, len(r.Paths))
	}
	if r.MaxSubflows > uint32(MaxSubflows) {
		return fmt.Errorf("max subflows %d, at most %d (the kernel's limit)", r.MaxSubflows, MaxSubflows)
	}
	if len(r.Backup) > 0 && !r.RewriteHeaders {
		return errors.New("backup paths flag joins by rewriting MP_JOIN, which needs the header-rewriting opt-in")
	}
	switch r.Spread {
	case SpreadRoundRobin, SpreadPreferred:
		if len(r.Weights) != 0 {
			return fmt.Errorf("weights given for spread mode %v, which ignores them", r.Spread)
		}
	case SpreadWeighted:
		if len(r.Weights) != 0 && len(r.Weights) != len(r.Paths) {
			return fmt.Errorf("%d weights for %d paths", len(r.Weights), len(r.Paths))
		}
		for i, w := range r.Weights {
			if w == 0 || w > uint32(MaxWeight) {
				return fmt.Errorf("weight %d of path %d out of range 1..%d", w, r.Paths[i], MaxWeight)
			}
		}
	default:
		return fmt.Errorf("unknown spread mode %d", r.Spread)
	}
	return nil
}

// validateSelector checks what the rule selects: family, match bits, port
// ranges and CIDRs.
func (r Rule) validateSelector() error {
	switch r.Family {
	case FamilyAny, FamilyIPv4, FamilyIPv6:
	default:
		return fmt.Errorf("unknown address family %d", r.Family)
	}
	if r.Match&^MatchAll != 0 {
		return fmt.Errorf("unknown match bits %#x", uint8(r.Match&^MatchAll))
	}
	if len(r.Ports) > MaxRulePorts {
		return fmt.Errorf("%d port ranges, at most %d", len(r.Ports), MaxRulePorts)
	}
	if len(r.CIDRs) > MaxRuleCIDRs {
		return fmt.Errorf("%d CIDRs, at most %d", len(r.CIDRs), MaxRuleCIDRs)
	}
	for _, pr := range r.Ports {
		if pr.First == 0 || pr.First > pr.Last {
			return fmt.Errorf("port range %d-%d is empty or starts at 0", pr.First, pr.Last)
		}
	}
	for _, c := range r.CIDRs {
		if !c.IsValid() {
			return fmt.Errorf("invalid CIDR %v", c)
		}
		if c.Addr().Is4In6() {
			return fmt.Errorf("CIDR %v: write IPv4 CIDRs in IPv4 form", c)
		}
		if r.Family == FamilyIPv4 && !c.Addr().Is4() || r.Family == FamilyIPv6 && c.Addr().Is4() {
			return fmt.Errorf("CIDR %v does not belong to the rule's family", c)
		}
	}
	return nil
}

func cidrKey(id uint32, c netip.Prefix) datapathCidrKey {
	c = c.Masked()
	k := datapathCidrKey{
		Prefixlen: uint32(cidrKeyFixedBits + c.Bits()),
		Rule:      id>>24 | id>>8&0xff00 | id<<8&0xff0000 | id<<24, // big endian
		Family:    family(c.Addr()),
	}
	copy(k.Addr[:], c.Addr().AsSlice())
	return k
}

// SetRule writes rule id. It is a rewrite of map entries, taking effect for
// the next new subflow; subflows already placed keep their path. The CIDRs
// are written before the rule and stale ones removed after it, so a rewrite
// never selects less than both the old and the new rule have in common.
func (d *Datapath) SetRule(id uint32, r Rule) error {
	if id >= uint32(MaxRules) {
		return fmt.Errorf("rule %d: id out of range 0..%d", id, MaxRules-1)
	}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("rule %d: %w", id, err)
	}
	want := map[datapathCidrKey]bool{}
	for _, c := range r.CIDRs {
		k := cidrKey(id, c)
		want[k] = true
		if err := d.objs.RuleCidrs.Put(&k, uint32(1)); err != nil {
			return fmt.Errorf("rule %d: writing CIDR %v: %w", id, c, err)
		}
	}
	var v datapathRule
	// Keep the cursor of a rule that already exists, so a rewrite does
	// not skew the spread.
	if err := d.objs.Rules.Lookup(id, &v); err != nil {
		return fmt.Errorf("rule %d: reading: %w", id, err)
	}
	rr := v.Rr
	v = datapathRule{Rr: rr, Npaths: uint32(len(r.Paths) + len(r.Backup)), Nbackup: uint32(len(r.Backup)), MaxSubflows: r.MaxSubflows,
		Family: uint8(r.Family), Match: uint8(r.Match), Spread: uint8(r.Spread), Nports: uint8(len(r.Ports)),
		Npreferred: uint32(r.Preferred)}
	for i, p := range append(slices.Clone(r.Paths), r.Backup...) {
		v.Paths[i] = uint8(p)
		v.Weights[i] = 1
		if i < len(r.Weights) {
			v.Weights[i] = uint8(r.Weights[i])
		}
	}
	if r.RewriteHeaders {
		v.Flags |= ruleRewriteHeaders
	}
	for _, g := range r.SharedRisk {
		var mask uint32
		for _, p := range g {
			mask |= 1 << p
		}
		for i, p := range append(slices.Clone(r.Paths), r.Backup...) {
			if slices.Contains(g, p) {
				v.Risk[i] = mask
				v.Flags |= ruleSharedRisk
			}
		}
	}
	for _, p := range r.Blocked {
		v.Blocked |= 1 << p
	}
	for i, pr := range r.Ports {
		v.Ports[i] = datapathPortRange{First: pr.First, Last: pr.Last}
	}
	if len(r.CIDRs) > 0 {
		v.Flags |= ruleCIDRs
	}
	if err := d.objs.Rules.Put(id, &v); err != nil {
		return fmt.Errorf("rule %d: writing: %w", id, err)
	}
	return d.pruneCIDRs(id, want)
}

// RuleAt reads rule id back as the datapath holds it (what SetRule wrote;
// an empty Rule for an id never set or deleted).
func (d *Datapath) RuleAt(id uint32) (Rule, error) {
	var v datapathRule
	if err := d.objs.Rules.Lookup(id, &v); err != nil {
		return Rule{}, fmt.Errorf("rule %d: reading: %w", id, err)
	}
	n := min(int(v.Npaths), MaxPaths)
	nb := min(int(v.Nbackup), n)
	r := Rule{Spread: SpreadMode(v.Spread), Family: Family(v.Family), Match: Match(v.Match), MaxSubflows: v.MaxSubflows,
		RewriteHeaders: v.Flags&ruleRewriteHeaders != 0, Preferred: int(v.Npreferred)}
	for i := 0; i < n; i++ {
		if i < n-nb {
			r.Paths = append(r.Paths, uint32(v.Paths[i]))
			if r.Spread == SpreadWeighted {
				r.Weights = append(r.Weights, uint32(v.Weights[i]))
			}
		} else {
			r.Backup = append(r.Backup, uint32(v.Paths[i]))
		}
	}
	for p := uint32(1); ValidPath(p); p++ {
		if v.Blocked&(1<<p) != 0 {
			r.Blocked = append(r.Blocked, p)
		}
	}
	r.SharedRisk = riskGroups(v.Paths[:n], v.Risk[:n])
	for i := 0; i < min(int(v.Nports), MaxRulePorts); i++ {
		r.Ports = append(r.Ports, PortRange{First: v.Ports[i].First, Last: v.Ports[i].Last})
	}
	var k datapathCidrKey
	var one uint32
	it := d.objs.RuleCidrs.Iterate()
	for it.Next(&k, &one) {
		if k.Rule != cidrKey(id, netip.Prefix{}).Rule {
			continue
		}
		bits := int(k.Prefixlen) - cidrKeyFixedBits
		if p, err := addrFrom(k.Family, k.Addr).Prefix(bits); err == nil {
			r.CIDRs = append(r.CIDRs, p)
		}
	}
	slices.SortFunc(r.CIDRs, func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
	return r, it.Err()
}

// riskGroups reads a rule's shared-risk groups back from its slots' paths
// and risk masks, in Rule.SharedRisk's order.
func riskGroups(paths []uint8, risk []uint32) [][]uint32 {
	var groups [][]uint32
	seen := map[uint32]bool{}
	for _, mask := range risk {
		if mask == 0 || seen[mask] {
			continue
		}
		seen[mask] = true
		var g []uint32
		for j, p := range paths {
			if risk[j] == mask {
				g = append(g, uint32(p))
			}
		}
		groups = append(groups, g)
	}
	return groups
}

// Flags of struct rule (enum rule_flag).
const (
	ruleCIDRs          = uint32(datapathRuleFlagRULE_CIDRS)
	ruleRewriteHeaders = uint32(datapathRuleFlagRULE_REWRITE_HEADERS)
	ruleSharedRisk     = uint32(datapathRuleFlagRULE_SHARED_RISK)
)

// pruneCIDRs deletes rule id's CIDRs that are not in keep.
func (d *Datapath) pruneCIDRs(id uint32, keep map[datapathCidrKey]bool) error {
	var stale []datapathCidrKey
	var k datapathCidrKey
	var v uint32
	it := d.objs.RuleCidrs.Iterate()
	for it.Next(&k, &v) {
		if cidrKey(id, netip.Prefix{}).Rule == k.Rule && !keep[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("rule %d: listing CIDRs: %w", id, err)
	}
	for _, k := range stale {
		if err := d.objs.RuleCidrs.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("rule %d: deleting a stale CIDR: %w", id, err)
		}
	}
	return nil
}

// DeleteRule empties rule id: it selects nothing from now on (an empty
// path list), and its CIDRs are removed. Subflows and connections already
// placed by it keep their paths; joins of its connections are no longer
// placed.
func (d *Datapath) DeleteRule(id uint32) error {
	if id >= uint32(MaxRules) {
		return fmt.Errorf("rule %d: id out of range 0..%d", id, MaxRules-1)
	}
	if err := d.objs.Rules.Put(id, &datapathRule{}); err != nil {
		return fmt.Errorf("rule %d: clearing: %w", id, err)
	}
	return d.pruneCIDRs(id, nil)
}

func endpointKey(addr netip.Addr) datapathEndpointKey {
	k := datapathEndpointKey{Family: family(addr)}
	copy(k.Addr[:], addr.AsSlice())
	return k
}

func family(addr netip.Addr) uint8 {
	if addr.Is4() {
		return 2 // AF_INET
	}
	return 10 // AF_INET6
}

// SetEndpoint selects a local pod address for one rule (a shorthand for
// SetEndpointRules with one rule).
func (d *Datapath) SetEndpoint(addr netip.Addr, rule uint32) error {
	return d.SetEndpointRules(addr, rule)
}

// SetEndpointRules gives a local pod address its selector chain: rule ids,
// highest priority first. Each new subflow takes the first rule that
// selects it. The pod's counters are created with it (and kept on rewrite).
func (d *Datapath) SetEndpointRules(addr netip.Addr, rules ...uint32) error {
	addr = addr.Unmap()
	if !addr.IsValid() {
		return errors.New("endpoint: invalid address")
	}
	if len(rules) == 0 || len(rules) > MaxPodRules {
		return fmt.Errorf("endpoint %v: %d rules, want 1 to %d", addr, len(rules), MaxPodRules)
	}
	v := datapathEndpoint{Nrules: uint32(len(rules))}
	for i, id := range rules {
		if id >= uint32(MaxRules) {
			return fmt.Errorf("endpoint %v: rule id %d out of range 0..%d", addr, id, MaxRules-1)
		}
		v.Rules[i] = id
	}
	k := endpointKey(addr)
	slot, err := d.podSlot(k)
	if err != nil {
		return fmt.Errorf("endpoint %v: %w", addr, err)
	}
	v.PodSlot = slot
	if err := d.objs.Endpoints.Put(&k, &v); err != nil {
		return errors.Join(fmt.Errorf("endpoint %v: writing: %w", addr, err), d.releasePodSlot(slot, k))
	}
	return nil
}

// releasePodSlot clears slot if k owns it, so that no packet counts there.
func (d *Datapath) releasePodSlot(slot uint32, k datapathEndpointKey) error {
	if slot == 0 || d.podSlotOwner(slot) != k {
		return nil
	}
	return d.givePodSlot(slot, datapathEndpointKey{})
}

// givePodSlot makes owner (zero: nobody) the owner of slot, with counters
// at zero on every CPU and no SYN or answered join waiting.
func (d *Datapath) givePodSlot(slot uint32, owner datapathEndpointKey) error {
	fresh := make([]datapathPodRecord, ebpf.MustPossibleCPU())
	for i := range fresh {
		fresh[i].Owner = owner
	}
	if err := d.objs.PodRecords.Put(slot, fresh); err != nil {
		return err
	}
	if owner == (datapathEndpointKey{}) {
		return d.takePodMaps(slot)
	}
	return d.givePodMaps(slot)
}

// podSlot returns the pod_records slot of the endpoint at k: the one it
// has, or a free one, given to it with zeroed counters (the pod's counters
// start with its selection, as a new series). A slot is free when no other
// endpoint names it; one only a failed write left owned is taken back. The
// agent's reconcile is the only writer of endpoints, one at a time.
func (d *Datapath) podSlot(k datapathEndpointKey) (uint32, error) {
	var cur datapathEndpoint
	if err := d.objs.Endpoints.Lookup(&k, &cur); err == nil && cur.PodSlot != 0 && d.podSlotOwner(cur.PodSlot) == k {
		return cur.PodSlot, nil
	}
	used := map[uint32]bool{}
	var ek datapathEndpointKey
	var ev datapathEndpoint
	it := d.objs.Endpoints.Iterate()
	for it.Next(&ek, &ev) {
		if ek != k {
			used[ev.PodSlot] = true
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("reading endpoints: %w", err)
	}
	slot, err := d.freePodSlot(k, used)
	if err != nil {
		return 0, err
	}
	if err := d.givePodSlot(slot, k); err != nil {
		return 0, fmt.Errorf("creating its counters: %w", err)
	}
	return slot, nil
}

// freePodSlot chooses a slot no endpoint but k's names (used) for k. A free
// slot can still count subflow entries (pod_subflows): those of a pod
// released while its subflows were open, which ForgetLocal keeps. Such a
// slot goes back to that pod's address when it is selected again, and to
// no other while a slot counting nothing is free: a pod released and
// selected again would otherwise start a new share beside its old entries,
// and the next pod selected would start with the released one's.
func (d *Datapath) freePodSlot(k datapathEndpointKey, used map[uint32]bool) (uint32, error) {
	counts := make([]uint32, MaxPods+1)
	for slot := range counts {
		if err := d.objs.PodSubflows.Lookup(uint32(slot), &counts[slot]); err != nil {
			return 0, fmt.Errorf("reading the subflow entries of pod slot %d: %w", slot, err)
		}
	}
	tainted := false
	for slot := 1; slot <= MaxPods; slot++ {
		tainted = tainted || (!used[uint32(slot)] && counts[slot] != 0)
	}
	if tainted {
		if slot, err := d.entriesSlot(k); err != nil {
			return 0, err
		} else if slot != 0 && !used[slot] {
			return slot, nil
		}
	}
	for _, clean := range []bool{true, false} {
		for slot := uint32(1); slot <= uint32(MaxPods); slot++ {
			if !used[slot] && (!clean || counts[slot] == 0) {
				return slot, nil
			}
		}
	}
	return 0, fmt.Errorf("no counter slot left: %d pods selected", MaxPods)
}

// entriesSlot is the pod slot the subflow entries of k's address carry (0:
// it has none).
func (d *Datapath) entriesSlot(k datapathEndpointKey) (uint32, error) {
	var slot uint32
	err := readTable(d.objs.Subflows, subflowWays, func(e *datapathSubflowEntry) {
		if slot == 0 && e.Key.Family == k.Family && e.Key.Saddr == k.Addr {
			slot = e.Value.PodSlot
		}
	})
	if err != nil {
		return 0, fmt.Errorf("reading the subflow table: %w", err)
	}
	return slot, nil
}

// podSlotOwner is the endpoint a slot was given to (zero: none).
func (d *Datapath) podSlotOwner(slot uint32) datapathEndpointKey {
	var perCPU []datapathPodRecord
	if err := d.objs.PodRecords.Lookup(slot, &perCPU); err != nil || len(perCPU) == 0 {
		return datapathEndpointKey{}
	}
	return perCPU[0].Owner
}

// DeleteEndpoint stops selecting addr and drops its counters. Subflows
// already placed keep their path until they end; those still open stop
// counting for the pod (their slot has no owner, or another one, since).
func (d *Datapath) DeleteEndpoint(addr netip.Addr) error {
	k := endpointKey(addr.Unmap())
	var cur datapathEndpoint
	err := d.objs.Endpoints.Lookup(&k, &cur)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := d.objs.Endpoints.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	if err := d.releasePodSlot(cur.PodSlot, k); err != nil {
		return fmt.Errorf("endpoint %v: clearing its counters: %w", addr, err)
	}
	return nil
}

// EndpointRules lists the selected addresses and their rule chains.
func (d *Datapath) EndpointRules() (map[netip.Addr][]uint32, error) {
	out := map[netip.Addr][]uint32{}
	var k datapathEndpointKey
	var v datapathEndpoint
	it := d.objs.Endpoints.Iterate()
	for it.Next(&k, &v) {
		n := min(int(v.Nrules), MaxPodRules)
		out[addrFrom(k.Family, k.Addr)] = slices.Clone(v.Rules[:n])
	}
	return out, it.Err()
}

// Endpoints lists the selected addresses and their first (highest
// priority) rule.
func (d *Datapath) Endpoints() (map[netip.Addr]uint32, error) {
	chains, err := d.EndpointRules()
	out := make(map[netip.Addr]uint32, len(chains))
	for a, rules := range chains {
		if len(rules) > 0 {
			out[a] = rules[0]
		}
	}
	return out, err
}

// pathDown is PATH_DOWN of enum path_flag.
const pathDown = uint32(datapathPathFlagPATH_DOWN)

// SetPathDown marks path down (no new subflow is placed on it, joins move
// to other paths) or up again. Subflows already on it keep it: moving them
// would break them; MPTCP moves their data to other subflows.
func (d *Datapath) SetPathDown(path uint32, down bool) error {
	if !ValidPath(path) {
		return fmt.Errorf("path index %d out of range 1..%d", path, MaxPaths)
	}
	var v datapathPathState
	if down {
		v.Flags = pathDown
	}
	if err := d.objs.PathStates.Put(path, &v); err != nil {
		return fmt.Errorf("path %d: writing its state: %w", path, err)
	}
	return nil
}

// PathDown says whether path is marked down.
func (d *Datapath) PathDown(path uint32) (bool, error) {
	var v datapathPathState
	if err := d.objs.PathStates.Lookup(path, &v); err != nil {
		return false, fmt.Errorf("path %d: reading its state: %w", path, err)
	}
	return v.Flags&pathDown != 0, nil
}

// PodInterface is a selected pod's address on the host-side interface its
// packets enter the node by (Ifindex, in the node's namespace).
type PodInterface struct {
	Ifindex int
	Addr    netip.Addr
}

// SyncPodInterfaces makes the table of the pods' interfaces hold exactly
// want: what a pod sends that no subflow entry names is charged to the pod
// whose interface it came in by, whatever source address it carries
// (nic_egress). A pod has one address per family there.
func (d *Datapath) SyncPodInterfaces(want []PodInterface) error {
	keep := map[datapathPodIfKey]bool{}
	for _, p := range want {
		addr := p.Addr.Unmap()
		if p.Ifindex <= 0 || !addr.IsValid() {
			return fmt.Errorf("pod interface %d, address %v: invalid", p.Ifindex, p.Addr)
		}
		k := datapathPodIfKey{Ifindex: uint32(p.Ifindex), Family: uint32(family(addr))}
		v := endpointKey(addr)
		if err := d.objs.PodInterfaces.Put(&k, &v); err != nil {
			return fmt.Errorf("pod interface %d, address %v: %w", p.Ifindex, addr, err)
		}
		keep[k] = true
	}
	return deleteUnwanted[datapathPodIfKey, datapathEndpointKey](d.objs.PodInterfaces, keep)
}

// deleteUnwanted deletes the entries of m whose keys keep does not hold.
func deleteUnwanted[K comparable, V any](m *ebpf.Map, keep map[K]bool) error {
	var stale []K
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !keep[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range stale {
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}
