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
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/cni"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/linkwatch"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/liveness"
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
	// CNIConfDir is where the node's container runtime reads its CNI
	// configuration (default /etc/cni/net.d): the agent names the CNI
	// from it, and the marks it uses.
	CNIConfDir string `json:"cniConfDir,omitempty"`
	// CNIMarks are the skb->mark bits the node's CNI uses, when not the
	// defaults the agent knows for it (Calico's FELIX_IPTABLESMARKMASK,
	// say). The agent enforces nothing while they share a bit with
	// MarkMask.
	CNIMarks *uint32 `json:"cniMarks,omitempty"`
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
	// FlapDamping holds a path NIC that keeps losing its carrier down for
	// a while after it comes back (docs/agent.md, "Link events").
	FlapDamping FlapDamping `json:"flapDamping,omitzero"`
	// Liveness is how the agent probes its paths to its peers
	// (docs/agent.md, "Liveness").
	Liveness Liveness `json:"liveness,omitzero"`
	// JoinHoldoff is how long a join the agent opens (userspace mode)
	// stays a backup subflow after it is established, against a kernel
	// defect that changes data a join receives too early
	// (docs/subflows.md, "Held joins"). Unset: DefaultJoinHoldoff; 0
	// opens joins active.
	JoinHoldoff *metav1.Duration `json:"joinHoldoff,omitempty"`
}

// DefaultJoinHoldoff is twenty times the longest the bed has seen a
// receiver hold its socket while a join came in (under 1 ms), and short
// enough not to add stalls: held for 100 ms, a connection pushes all it
// can onto its first subflow meanwhile, and on congested paths stalled
// four times as often (docs/subflows.md, "Held joins").
const DefaultJoinHoldoff = 20 * time.Millisecond

// MaxJoinHoldoff bounds the hold: a join held longer adds nothing to the
// transfers it was opened for.
const MaxJoinHoldoff = 10 * time.Second

// ParseJoinHoldoff reads the agent's -join-holdoff flag: a Go duration
// from 0 (joins opened active) to MaxJoinHoldoff.
func ParseJoinHoldoff(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("join holdoff %q: %w", v, err)
	}
	return d, validJoinHoldoff(d)
}

func validJoinHoldoff(d time.Duration) error {
	if d < 0 || d > MaxJoinHoldoff {
		return fmt.Errorf("joinHoldoff %v: must be from 0 (off) to %v", d, MaxJoinHoldoff)
	}
	return nil
}

// joinHoldoff is the hold the settings ask for.
func (s Settings) joinHoldoff() time.Duration {
	if s.JoinHoldoff == nil {
		return DefaultJoinHoldoff
	}
	return s.JoinHoldoff.Duration
}

// Liveness: a probe every Interval over each path to each busy peer (one
// the node's pods send to) and every IdleInterval to the others, from and
// to UDP Port; a peer silent for DetectMultiplier of its intervals is down
// on the path, and a path down to every peer is marked down in the
// datapath like a NIC without carrier. Zero fields take the defaults; Off
// stops probing.
type Liveness struct {
	Off              bool            `json:"off,omitempty"`
	Port             int             `json:"port,omitempty"`
	Interval         metav1.Duration `json:"interval,omitzero"`
	DetectMultiplier int             `json:"detectMultiplier,omitempty"`
	IdleInterval     metav1.Duration `json:"idleInterval,omitzero"`
}

// Liveness defaults: a path that carries nothing for 150 ms is down,
// before a subflow's first retransmission timeout (200 ms at least) fires
// into it and backs off: found at 300 ms, the timer had doubled to 400 ms
// and the subflow stalled 600 ms after its detour (docs/testing.md).
// Probes cost per node, each interval, two datagrams of 52 bytes on the
// wire (a probe and its echo) per path and peer each way.
const (
	DefaultLivenessPort       = 7471
	DefaultLivenessInterval   = 30 * time.Millisecond
	DefaultLivenessMultiplier = 5
	// DefaultLivenessIdleInterval: 1,000 idle peers over 4 paths cost
	// 2,000 probes a second, and a path that fails towards them is found
	// in 10 s (docs/benchmarks.md, "Liveness probes").
	DefaultLivenessIdleInterval = liveness.IdleInterval
)

// Bounds of the liveness settings: probes faster than 10 ms would cost
// more than they tell on a loaded node, and slower than 10 s tell nothing
// a user waits for.
const (
	MinLivenessInterval   = 10 * time.Millisecond
	MaxLivenessInterval   = 10 * time.Second
	MinLivenessMultiplier = 2
	MaxLivenessMultiplier = 100
	// An idle peer is probed at least every minute (a failure towards it
	// found within minutes), and not faster than every second: faster is
	// what busy peers are for.
	MinLivenessIdleInterval = time.Second
	MaxLivenessIdleInterval = time.Minute
)

// ParseLiveness reads the agent's -liveness flag: "off", or
// PORT/INTERVAL/MULTIPLIER[/IDLE], e.g. "7471/30ms/5" or "7471/30ms/5/2s".
func ParseLiveness(v string) (Liveness, error) {
	if v == "off" {
		return Liveness{Off: true}, nil
	}
	parts := strings.Split(v, "/")
	if len(parts) != 3 && len(parts) != 4 {
		return Liveness{}, fmt.Errorf("liveness %q: want PORT/INTERVAL/MULTIPLIER[/IDLE] (e.g. 7471/30ms/5 or 7471/30ms/5/2s) or off", v)
	}
	var l Liveness
	var err error
	if l.Port, err = strconv.Atoi(parts[0]); err != nil || l.Port < 1 {
		return Liveness{}, fmt.Errorf("liveness %q: %q is not a port", v, parts[0])
	}
	if l.Interval.Duration, err = time.ParseDuration(parts[1]); err != nil || l.Interval.Duration <= 0 {
		return Liveness{}, fmt.Errorf("liveness %q: %q is not a positive duration", v, parts[1])
	}
	if l.DetectMultiplier, err = strconv.Atoi(parts[2]); err != nil || l.DetectMultiplier < 1 {
		return Liveness{}, fmt.Errorf("liveness %q: %q is not a whole number from 1", v, parts[2])
	}
	if len(parts) == 4 {
		if l.IdleInterval.Duration, err = time.ParseDuration(parts[3]); err != nil || l.IdleInterval.Duration <= 0 {
			return Liveness{}, fmt.Errorf("liveness %q: %q is not a positive duration", v, parts[3])
		}
	}
	return l, l.validate()
}

func (l Liveness) validate() error {
	if l.Port < 0 || l.Port > 65535 {
		return fmt.Errorf("liveness.port %d: must be from 1 to 65535", l.Port)
	}
	if d := l.Interval.Duration; d != 0 && (d < MinLivenessInterval || d > MaxLivenessInterval) {
		return fmt.Errorf("liveness.interval %v: must be from %v to %v", d, MinLivenessInterval, MaxLivenessInterval)
	}
	if m := l.DetectMultiplier; m != 0 && (m < MinLivenessMultiplier || m > MaxLivenessMultiplier) {
		return fmt.Errorf("liveness.detectMultiplier %d: must be from %d to %d", m, MinLivenessMultiplier, MaxLivenessMultiplier)
	}
	if d := l.IdleInterval.Duration; d != 0 && (d < MinLivenessIdleInterval || d > MaxLivenessIdleInterval) {
		return fmt.Errorf("liveness.idleInterval %v: must be from %v to %v", d, MinLivenessIdleInterval, MaxLivenessIdleInterval)
	}
	if idle := l.IdleInterval.Duration; idle != 0 && idle < l.Interval.Duration {
		return fmt.Errorf("liveness.idleInterval %v: must not be shorter than interval %v", idle, l.Interval.Duration)
	}
	return nil
}

// FlapDamping: after Transitions carrier losses of a path NIC within
// Window, its paths stay down until it has been back for Hold.
// Transitions 0 takes the default; -1 turns damping off.
type FlapDamping struct {
	Transitions int             `json:"transitions,omitempty"`
	Window      metav1.Duration `json:"window,omitzero"`
	Hold        metav1.Duration `json:"hold,omitzero"`
}

// Flap damping defaults: three losses within a minute hold the path down
// until the NIC has kept its carrier for 10 s.
const (
	DefaultFlapTransitions = 3
	DefaultFlapWindow      = time.Minute
	DefaultFlapHold        = 10 * time.Second
)

// ParseFlapDamping reads the agent's -flap-damping flag: "off", or
// TRANSITIONS/WINDOW/HOLD with Go durations, e.g. "3/1m/10s".
func ParseFlapDamping(v string) (FlapDamping, error) {
	if v == "off" {
		return FlapDamping{Transitions: -1}, nil
	}
	parts := strings.Split(v, "/")
	if len(parts) != 3 {
		return FlapDamping{}, fmt.Errorf("flap damping %q: want TRANSITIONS/WINDOW/HOLD (e.g. 3/1m/10s) or off", v)
	}
	n, err := strconv.Atoi(parts[0])
	if err != nil || n < 1 {
		return FlapDamping{}, fmt.Errorf("flap damping %q: transitions must be a whole number from 1 (or the value off)", v)
	}
	var f FlapDamping
	f.Transitions = n
	for i, d := range []*metav1.Duration{&f.Window, &f.Hold} {
		if d.Duration, err = time.ParseDuration(parts[i+1]); err != nil || d.Duration <= 0 {
			return FlapDamping{}, fmt.Errorf("flap damping %q: %q is not a positive duration", v, parts[i+1])
		}
	}
	return f, nil
}

func (f FlapDamping) validate() error {
	if f.Transitions < -1 || f.Window.Duration < 0 || f.Hold.Duration < 0 {
		return fmt.Errorf("flapDamping: transitions must be -1 (off) or more, window and hold not negative")
	}
	return nil
}

func (f FlapDamping) damping() linkwatch.Damping {
	if f.Transitions < 0 {
		return linkwatch.Damping{}
	}
	return linkwatch.Damping{Transitions: f.Transitions, Window: f.Window.Duration, Hold: f.Hold.Duration}
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
	if s.CNIConfDir == "" {
		s.CNIConfDir = cni.DefaultConfDir
	}
	if s.FlapDamping.Transitions == 0 {
		s.FlapDamping.Transitions = DefaultFlapTransitions
	}
	if s.FlapDamping.Window.Duration == 0 {
		s.FlapDamping.Window.Duration = DefaultFlapWindow
	}
	if s.FlapDamping.Hold.Duration == 0 {
		s.FlapDamping.Hold.Duration = DefaultFlapHold
	}
	if s.Liveness.Port == 0 {
		s.Liveness.Port = DefaultLivenessPort
	}
	if s.Liveness.Interval.Duration == 0 {
		s.Liveness.Interval.Duration = DefaultLivenessInterval
	}
	if s.Liveness.DetectMultiplier == 0 {
		s.Liveness.DetectMultiplier = DefaultLivenessMultiplier
	}
	if s.Liveness.IdleInterval.Duration == 0 {
		s.Liveness.IdleInterval.Duration = max(DefaultLivenessIdleInterval, s.Liveness.Interval.Duration)
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
	if err := errors.Join(s.FlapDamping.validate(), s.Liveness.validate()); err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	if s.JoinHoldoff != nil {
		if err := validJoinHoldoff(s.JoinHoldoff.Duration); err != nil {
			return s, fmt.Errorf("%s: %w", path, err)
		}
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

// LoadPeers reads the cluster's MPTCPPeers from a YAML file (file mode):
// a list, as `kubectl get mptcppeers -o yaml` prints it. No path is no
// peers; a field the type does not know is an error.
func LoadPeers(path string) ([]mptcpv1alpha1.MPTCPPeer, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var l mptcpv1alpha1.MPTCPPeerList
	if err := yaml.UnmarshalStrict(b, &l); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if l.Kind != "" && l.Kind != "MPTCPPeerList" && l.Kind != "List" {
		return nil, fmt.Errorf("%s: kind %q, want MPTCPPeerList", path, l.Kind)
	}
	for i, p := range l.Items {
		if p.Name == "" {
			return nil, fmt.Errorf("%s: items[%d].metadata.name: must be the peer node's name", path, i)
		}
	}
	return l.Items, nil
}

// PlanFromFiles is file mode's reconcile input: the settings file, the
// node state file and the peers file (none: no peers), translated with
// this node's links and pods as kube mode translates the API's
// (FromNodeState). A node state that cannot be
// enforced as a whole is an error listing every problem; paths this node
// cannot carry and pods skipped for a problem of their own are left out and
// returned as problems. prior is what the node holds already (Agent.Prior).
func PlanFromFiles(settingsPath, nodeStatePath, peersPath string, prior Prior) (*Plan, []string, error) {
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
	peers, err := LoadPeers(peersPath)
	if err != nil {
		return nil, nil, err
	}
	links, err := Links()
	if err != nil {
		return nil, nil, err
	}
	tr := FromNodeState(settings, state, peers, links, LocatePod, prior)
	if len(tr.Errors) > 0 {
		return nil, nil, fmt.Errorf("%s: %s", nodeStatePath, strings.Join(Messages(append(tr.PathProblems, tr.Errors...)), "; "))
	}
	problems := Messages(tr.PathProblems)
	for _, p := range tr.PodProblems {
		problems = append(problems, DescribePodProblem(p))
	}
	return tr.Plan, problems, nil
}

// DescribePodProblem is how file mode reports a skipped pod.
func DescribePodProblem(p mptcpv1alpha1.PodProblem) string {
	return fmt.Sprintf("pod %s/%s skipped (%s): %s", p.Namespace, p.Name, p.Reason, p.Message)
}
