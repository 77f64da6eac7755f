// Package agent turns a node's configuration into an enforced datapath:
// BPF programs on the pods' host-side veths and the paths' NICs, one routing
// table and fwmark rule per path, and MPTCP settings inside pod namespaces.
package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"sigs.k8s.io/yaml"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// SubflowMode says who creates a connection's extra subflows.
type SubflowMode string

const (
	// SubflowsUserspace: the agent is the path manager of the pod's
	// namespace and opens joins itself from the pod's address (default).
	SubflowsUserspace SubflowMode = "userspace"
	// SubflowsSignal: server pods announce one extra port per extra path;
	// clients' in-kernel path managers join them.
	SubflowsSignal SubflowMode = "signal"
	// SubflowsNone leaves the pod's MPTCP settings alone (VM guests and
	// workloads that manage their own subflows).
	SubflowsNone SubflowMode = "none"
)

// Config is a node's configuration. In the walking skeleton it comes from a
// local file; later it is compiled from the API into MPTCPNodeState.
type Config struct {
	// Node is this node's name, used in logs and pin paths.
	Node string `json:"node"`
	// PinDir on bpffs holds the pinned maps and links.
	PinDir string `json:"pinDir"`
	// StateDir holds what uninstall needs to restore (original sysctls).
	StateDir string `json:"stateDir"`
	// MarkMask is the part of skb->mark that carries the path (default 0x00f00000).
	MarkMask uint32 `json:"markMask,omitempty"`
	// TableBase is the routing tables' base: path i uses TableBase+i.
	TableBase int `json:"tableBase,omitempty"`
	// RulePriority is the ip rule priorities' base: path i's fwmark rule has
	// RulePriority+i; the rule sending local pod CIDRs to the main table
	// sits at RulePriority-1, before them all.
	RulePriority int `json:"rulePriority,omitempty"`
	// ObserveOnly, when true, has the datapath record everything (subflows
	// with the path it would choose, connections, counters) without writing
	// a single mark: nothing is steered. Switched at run time, without a
	// re-attach; applied on every reconcile.
	ObserveOnly bool `json:"observeOnly,omitempty"`
	// PodCIDRs are this node's pod address ranges: traffic to them is never
	// steered out of a NIC.
	PodCIDRs []netip.Prefix `json:"podCIDRs"`
	Paths    []Path         `json:"paths"`
	Rules    []Rule         `json:"rules"`
	Pods     []Pod          `json:"pods"`
}

// Path is one of the node's paths: a NIC and the next hop beyond it.
type Path struct {
	Name string `json:"name"`
	// Index numbers the path cluster-wide (1..15, MPTCPPath status.index):
	// it is the mark's value and the routing table's offset, so both nodes
	// of a subflow agree on it.
	Index     uint32     `json:"index"`
	Interface string     `json:"interface"`
	Gateway   netip.Addr `json:"gateway"`
	// Capacity is the path's rate in bits per second (MPTCPPath
	// spec.capacity): per-path caps above it cap at it, and the HTB
	// classes on its NIC share it. 0: unbounded.
	Capacity uint64 `json:"capacity,omitempty"`
}

// Rule is a compiled policy: which paths a selected pod's subflows spread over.
type Rule struct {
	Name  string   `json:"name"`
	Paths []string `json:"paths"`
	// Subflows says how the pods' extra subflows are created.
	Subflows SubflowMode `json:"subflows,omitempty"`
	// MaxSubflows caps a connection's subflows (initial included); 0 means
	// one per path.
	MaxSubflows int `json:"maxSubflows,omitempty"`
	// SignalPorts are, in signal mode, the extra ports the rule's pods
	// announce, one per path after the first: the rule is for servers. A
	// signal-mode rule without ports is for clients: its pods only join the
	// ports their peers announce.
	SignalPorts []uint16 `json:"signalPorts,omitempty"`
	// DataChecksums turns on DSS checksums in the rule's pods
	// (net.mptcp.checksum_enabled), unless the pods' stacks are their own
	// (Subflows none).
	DataChecksums bool `json:"dataChecksums,omitempty"`
	// Traffic selects which of a pod's subflows the rule places; unset
	// selects all of them (docs/datapath.md, "Selectors").
	Traffic *Traffic `json:"traffic,omitempty"`
	// SpreadMode is roundRobin (default), weighted or preferred.
	SpreadMode string `json:"spreadMode,omitempty"`
	// Weights per path name, for weighted spread: the path's share of
	// subflow placements. A path left out weighs 1.
	Weights map[string]uint32 `json:"weights,omitempty"`
	// PreferredPaths, a tenant's preference, lead Paths: in every spread
	// mode a connection's initial subflow takes the first of them that is
	// up (CompiledRule.preferredPaths).
	PreferredPaths []string `json:"preferredPaths,omitempty"`
	// BackupPaths carry a connection's joins after the active paths, and
	// its first subflow only when no active path is up; joins on them are
	// flagged backup on their way into the pod (docs/datapath.md, "Backup
	// actor"), which needs HeaderRewriting.
	BackupPaths []string `json:"backupPaths,omitempty"`
	// BlockedPaths are paths a peer's join may not arrive on: the agent's
	// datapath answers it with MP_TCPRST (docs/datapath.md, "Block
	// actor"). Never among Paths or BackupPaths.
	BlockedPaths []string `json:"blockedPaths,omitempty"`
	// HeaderRewriting is the admin's opt-in to rewriting the headers of
	// the rule's pods' packets (CompiledRule.headerRewriting); the window
	// rate mode and backup paths need it.
	HeaderRewriting bool `json:"headerRewriting,omitempty"`
	// Rate caps the rule's connections, pods or paths (rate.go).
	Rate *RateLimits `json:"rate,omitempty"`
}

// Traffic is a rule's selector: remote CIDRs, service ports (the server's
// port, whichever side the pod is on) and address family (IPv4, IPv6).
type Traffic struct {
	CIDRs  []netip.Prefix `json:"cidrs,omitempty"`
	Ports  []PortRange    `json:"ports,omitempty"`
	Family string         `json:"family,omitempty"`
}

// PortRange is first..last, inclusive; last defaults to first.
type PortRange struct {
	First uint16 `json:"first"`
	Last  uint16 `json:"last,omitempty"`
}

var spreadModes = map[string]datapath.SpreadMode{
	"":           datapath.SpreadRoundRobin,
	"roundRobin": datapath.SpreadRoundRobin,
	"weighted":   datapath.SpreadWeighted,
	"preferred":  datapath.SpreadPreferred,
}

// datapathRule compiles r over the node's paths; Validate reports its
// errors, so on a valid configuration it does not fail.
func (r Rule) datapathRule(paths map[string]Path) (datapath.Rule, error) {
	var out datapath.Rule
	mode, ok := spreadModes[r.SpreadMode]
	if !ok {
		return out, fmt.Errorf("spreadMode: %q is not one of roundRobin, weighted, preferred", r.SpreadMode)
	}
	out.Spread = mode
	out.RewriteHeaders = r.HeaderRewriting
	out.MaxSubflows = uint32(max(r.MaxSubflows, 0))
	for _, name := range r.BackupPaths {
		out.Backup = append(out.Backup, paths[name].Index)
	}
	for _, name := range r.BlockedPaths {
		out.Blocked = append(out.Blocked, paths[name].Index)
	}
	for _, name := range r.Paths {
		out.Paths = append(out.Paths, paths[name].Index)
		if mode == datapath.SpreadWeighted {
			w, ok := r.Weights[name]
			if !ok {
				w = 1
			}
			out.Weights = append(out.Weights, w)
		}
	}
	for out.Preferred < len(r.Paths) && slices.Contains(r.PreferredPaths, r.Paths[out.Preferred]) {
		out.Preferred++
	}
	for name := range r.Weights {
		if mode != datapath.SpreadWeighted {
			return out, errors.New("weights: only for spreadMode weighted")
		}
		if !slices.Contains(r.Paths, name) {
			return out, fmt.Errorf("weights: %q is not one of the rule's paths", name)
		}
	}
	if t := r.Traffic; t != nil {
		out.CIDRs = t.CIDRs
		for _, pr := range t.Ports {
			if pr.Last == 0 {
				pr.Last = pr.First
			}
			out.Ports = append(out.Ports, datapath.PortRange{First: pr.First, Last: pr.Last})
		}
		switch t.Family {
		case "":
		case "IPv4":
			out.Family = datapath.FamilyIPv4
		case "IPv6":
			out.Family = datapath.FamilyIPv6
		default:
			return out, fmt.Errorf("traffic.family: %q is not IPv4 or IPv6", t.Family)
		}
	}
	if err := out.Validate(); err != nil {
		return out, err
	}
	return out, nil
}

// Pod is a local pod selected by a rule.
type Pod struct {
	Name string `json:"name"`
	// NetNS is the path of the pod's network namespace.
	NetNS string `json:"netns"`
	// HostInterface is the pod's host-side veth.
	HostInterface string       `json:"hostInterface"`
	IPs           []netip.Addr `json:"ips"`
	// Rules are the pod's rules, highest priority first: each new subflow
	// takes the first whose traffic selects it. Rule is a shorthand for
	// one rule.
	Rules []string `json:"rules,omitempty"`
	Rule  string   `json:"rule,omitempty"`
}

// ruleNames is the pod's rule chain, the shorthand included.
func (p Pod) ruleNames() []string {
	if len(p.Rules) > 0 {
		return p.Rules
	}
	if p.Rule != "" {
		return []string{p.Rule}
	}
	return nil
}

// Defaults for fields left empty.
const (
	DefaultTableBase    = 3100
	DefaultRulePriority = 3100
	DefaultPinRoot      = "/sys/fs/bpf/mptcp-operator"
	DefaultStateRoot    = "/run/mptcp-operator"
)

// LoadConfig reads and checks a configuration file.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c Config
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}

func (c *Config) setDefaults() {
	if c.TableBase == 0 {
		c.TableBase = DefaultTableBase
	}
	if c.RulePriority == 0 {
		c.RulePriority = DefaultRulePriority
	}
	if c.PinDir == "" {
		c.PinDir = DefaultPinRoot + "/" + c.Node
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateRoot + "/" + c.Node
	}
	if c.MarkMask == 0 {
		c.MarkMask = datapath.DefaultMarkMask
	}
	for i := range c.Rules {
		if c.Rules[i].Subflows == "" {
			c.Rules[i].Subflows = SubflowsUserspace
		}
	}
}

// Validate reports every problem of the configuration at once.
func (c *Config) Validate() error {
	var errs []error
	if c.Node == "" {
		errs = append(errs, errors.New("node: must be set"))
	}
	paths := map[string]Path{}
	indexes := map[uint32]string{}
	ifaces := map[string]string{}
	for i, p := range c.Paths {
		switch {
		case p.Name == "":
			errs = append(errs, fmt.Errorf("paths[%d].name: must be set", i))
		case paths[p.Name].Name != "":
			errs = append(errs, fmt.Errorf("paths[%d].name: %q appears twice", i, p.Name))
		}
		if !datapath.ValidPath(p.Index) {
			errs = append(errs, fmt.Errorf("paths[%d].index: %d is out of range 1..%d", i, p.Index, datapath.MaxPaths))
		}
		if other, ok := indexes[p.Index]; ok {
			errs = append(errs, fmt.Errorf("paths[%d].index: %d is also path %q's", i, p.Index, other))
		}
		if p.Interface == "" {
			errs = append(errs, fmt.Errorf("paths[%d].interface: must be set", i))
		} else if other, ok := ifaces[p.Interface]; ok {
			errs = append(errs, fmt.Errorf("paths[%d].interface: %q is also path %q's", i, p.Interface, other))
		}
		paths[p.Name], indexes[p.Index], ifaces[p.Interface] = p, p.Name, p.Name
	}
	rules := map[string]bool{}
	for i, r := range c.Rules {
		if r.Name == "" || rules[r.Name] {
			errs = append(errs, fmt.Errorf("rules[%d].name: must be set and unique", i))
		}
		rules[r.Name] = true
		if len(r.Paths) == 0 {
			errs = append(errs, fmt.Errorf("rules[%d].paths: at least one path is needed", i))
		}
		for j, name := range r.Paths {
			if _, ok := paths[name]; !ok {
				errs = append(errs, fmt.Errorf("rules[%d].paths[%d]: no path named %q on this node", i, j, name))
			}
		}
		for j, name := range r.BackupPaths {
			if _, ok := paths[name]; !ok {
				errs = append(errs, fmt.Errorf("rules[%d].backupPaths[%d]: no path named %q on this node", i, j, name))
			}
			if slices.Contains(r.Paths, name) {
				errs = append(errs, fmt.Errorf("rules[%d].backupPaths[%d]: %q is also one of the rule's paths", i, j, name))
			}
		}
		for j, name := range r.BlockedPaths {
			if _, ok := paths[name]; !ok {
				errs = append(errs, fmt.Errorf("rules[%d].blockedPaths[%d]: no path named %q on this node", i, j, name))
			}
			if slices.Contains(r.Paths, name) || slices.Contains(r.BackupPaths, name) {
				errs = append(errs, fmt.Errorf("rules[%d].blockedPaths[%d]: %q is also one of the rule's paths or backup paths", i, j, name))
			}
		}
		if len(r.BackupPaths) > 0 && !r.HeaderRewriting {
			errs = append(errs, fmt.Errorf("rules[%d].backupPaths: flagging joins backup rewrites MP_JOIN options: set headerRewriting", i))
		}
		switch r.Subflows {
		case SubflowsUserspace, SubflowsNone:
		case SubflowsSignal:
			if len(r.SignalPorts) != 0 && len(r.SignalPorts) < r.joins() {
				errs = append(errs, fmt.Errorf("rules[%d].signalPorts: %d ports announce too few paths: a server needs %d, one per extra subflow", i, len(r.SignalPorts), r.joins()))
			}
		default:
			errs = append(errs, fmt.Errorf("rules[%d].subflows: %q is not one of userspace, signal, none", i, r.Subflows))
		}
		if r.Rate != nil {
			if err := r.Rate.validate(r, paths); err != nil {
				errs = append(errs, fmt.Errorf("rules[%d].rate: %w", i, err))
			}
		}
		if r.MaxSubflows < 0 || r.MaxSubflows > 8 {
			errs = append(errs, fmt.Errorf("rules[%d].maxSubflows: %d is out of range 0..8 (the kernel's limit)", i, r.MaxSubflows))
		}
		if _, err := r.datapathRule(paths); err != nil {
			errs = append(errs, fmt.Errorf("rules[%d]: %w", i, err))
		}
	}
	if len(c.Rules) > datapath.MaxRules {
		errs = append(errs, fmt.Errorf("rules: %d rules, at most %d", len(c.Rules), datapath.MaxRules))
	}
	for i, p := range c.Pods {
		if p.Rule != "" && len(p.Rules) > 0 {
			errs = append(errs, fmt.Errorf("pods[%d]: set rule or rules, not both", i))
		}
		names := p.ruleNames()
		if len(names) == 0 || len(names) > datapath.MaxPodRules {
			errs = append(errs, fmt.Errorf("pods[%d].rules: %d rules, want 1 to %d", i, len(names), datapath.MaxPodRules))
		}
		for _, name := range names {
			if !rules[name] {
				errs = append(errs, fmt.Errorf("pods[%d].rules: no rule named %q", i, name))
			}
		}
		if p.HostInterface == "" {
			errs = append(errs, fmt.Errorf("pods[%d].hostInterface: must be set", i))
		}
		if len(p.IPs) == 0 {
			errs = append(errs, fmt.Errorf("pods[%d].ips: at least one address is needed", i))
		}
	}
	return errors.Join(errs...)
}

// rule returns the rule of c named name, or nil.
func (c *Config) rule(name string) *Rule {
	for i := range c.Rules {
		if c.Rules[i].Name == name {
			return &c.Rules[i]
		}
	}
	return nil
}

// joins is how many extra subflows a connection under r gets.
func (r Rule) joins() int {
	n := len(r.Paths) + len(r.BackupPaths)
	if r.MaxSubflows > 0 && r.MaxSubflows < n {
		n = r.MaxSubflows
	}
	return n - 1
}
