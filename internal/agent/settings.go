// Package agent enforces a node's MPTCPNodeState: BPF programs on the pods'
// host-side veths and the paths' NICs, one routing table and fwmark rule per
// path, and MPTCP settings inside pod namespaces. The node state is the only
// model of what to enforce, in kube mode (from the API) and in file mode
// (from a YAML file); it is translated once into the datapath's types and
// the node's own facts (a Plan, FromNodeState).
package agent

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// Settings are what the agent of a node needs that no node state says:
// where it keeps its pins and its state, which routing tables, rule
// priorities and mark bits it owns, and whether it only observes. They come
// from the -config file, or are the defaults.
type Settings struct {
	// Node is this node's name: its MPTCPNodeState's, and in logs and pin
	// paths.
	Node string `json:"node"`
	// PinDir on bpffs holds the pinned maps and links.
	PinDir string `json:"pinDir,omitempty"`
	// StateDir holds what a restart and uninstall need (status, rule ids,
	// original sysctls, released pods).
	StateDir string `json:"stateDir,omitempty"`
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
}

// Defaults for settings left empty.
const (
	DefaultTableBase    = 3100
	DefaultRulePriority = 3100
	DefaultPinRoot      = "/sys/fs/bpf/mptcp-operator"
	DefaultStateRoot    = "/run/mptcp-operator"
)

// NodeDefaults are the settings of node when no file gives any.
func NodeDefaults(node string) Settings {
	s := Settings{Node: node}
	s.setDefaults()
	return s
}

func (s *Settings) setDefaults() {
	if s.TableBase == 0 {
		s.TableBase = DefaultTableBase
	}
	if s.RulePriority == 0 {
		s.RulePriority = DefaultRulePriority
	}
	if s.PinDir == "" {
		s.PinDir = DefaultPinRoot + "/" + s.Node
	}
	if s.StateDir == "" {
		s.StateDir = DefaultStateRoot + "/" + s.Node
	}
	if s.MarkMask == 0 {
		s.MarkMask = datapath.DefaultMarkMask
	}
}

// LoadSettings reads a settings file; a field it does not know is an
// error, so a misspelt one is not silently ignored.
func LoadSettings(path string) (Settings, error) {
	var s Settings
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := yaml.UnmarshalStrict(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	if s.Node == "" {
		return s, fmt.Errorf("%s: node: must be set", path)
	}
	s.setDefaults()
	return s, nil
}

// LoadNodeState reads a node state from a YAML file (file mode): the same
// object kube mode reads from the API, as `kubectl get mptcpnodestate -o
// yaml` prints it. Only its name and spec matter; a field the type does not
// know is an error.
func LoadNodeState(path string) (*mptcpv1alpha1.MPTCPNodeState, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s mptcpv1alpha1.MPTCPNodeState
	if err := yaml.UnmarshalStrict(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if s.Kind != "" && s.Kind != "MPTCPNodeState" {
		return nil, fmt.Errorf("%s: kind %q, want MPTCPNodeState", path, s.Kind)
	}
	if s.Name == "" {
		return nil, errors.New(path + ": metadata.name: must be the node's name")
	}
	return &s, nil
}

// PlanFromFiles is file mode's reconcile input: the settings file and the
// node state file, translated with this node's links and pods as kube mode
// translates the API's (FromNodeState). A node state that cannot be
// enforced as a whole is an error listing every problem; paths this node
// cannot carry and pods skipped for a problem of their own are left out and
// returned as problems. prior is what the node holds already (Agent.Prior).
func PlanFromFiles(settingsPath, nodeStatePath string, prior Prior) (*Plan, []string, error) {
	settings, err := LoadSettings(settingsPath)
	if err != nil {
		return nil, nil, err
	}
	state, err := LoadNodeState(nodeStatePath)
	if err != nil {
		return nil, nil, err
	}
	if state.Name != settings.Node {
		return nil, nil, fmt.Errorf("%s is node %q's state, not %q's", nodeStatePath, state.Name, settings.Node)
	}
	links, err := Links()
	if err != nil {
		return nil, nil, err
	}
	tr := FromNodeState(settings, state, links, LocatePod, prior)
	if len(tr.Errors) > 0 {
		return nil, nil, fmt.Errorf("%s: %s", nodeStatePath, strings.Join(append(tr.PathProblems, tr.Errors...), "; "))
	}
	problems := tr.PathProblems
	for _, p := range tr.PodProblems {
		problems = append(problems, DescribePodProblem(p))
	}
	return tr.Plan, problems, nil
}

// DescribePodProblem is how file mode reports a skipped pod.
func DescribePodProblem(p mptcpv1alpha1.PodProblem) string {
	return fmt.Sprintf("pod %s/%s skipped (%s): %s", p.Namespace, p.Name, p.Reason, p.Message)
}
