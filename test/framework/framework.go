// Package framework runs the node agent on a test bed: it turns a bed's
// topology into agent configurations, starts one agent per node namespace and
// waits for it to apply its configuration. The e2e tests, the demo and the
// benchmarks share it.
package framework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/compile"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// PathName names the path of NIC k: fabric-a, fabric-b, ...
func PathName(k int) string { return fmt.Sprintf("fabric-%c", 'a'+k-1) }

// RuleName is the policy whose rule every bed pod takes.
const RuleName = "spread"

// PodNamespace is the namespace bed pods have in the node states the
// framework writes (the bed's pods have no API objects in file mode).
const PodNamespace = "bed"

// NodeConfig is what a bed node's agent runs on in file mode, in the
// product's own schema: its node-local settings (the -config file), its
// MPTCPNodeState (the -node-state file) and the other nodes' MPTCPPeers
// (the -peers file), as the controller would compile them.
type NodeConfig struct {
	agent.Settings
	State *mptcpv1alpha1.MPTCPNodeState
	Peers []mptcpv1alpha1.MPTCPPeer
}

// Rule returns the first rule of the node state (the one AgentConfig
// gives every pod).
func (c *NodeConfig) Rule() *mptcpv1alpha1.CompiledRule { return &c.State.Spec.Rules[0] }

// Copy is a deep copy, to change without touching the running one's.
func (c *NodeConfig) Copy() *NodeConfig {
	peers := make([]mptcpv1alpha1.MPTCPPeer, len(c.Peers))
	for i := range c.Peers {
		c.Peers[i].DeepCopyInto(&peers[i])
	}
	return &NodeConfig{Settings: c.Settings, State: c.State.DeepCopy(), Peers: peers}
}

// renamed names every rule of the state as the controller would (a policy's
// name and a hash of the rule, compile.RuleName), and the pods' references
// with them: a test that changes a rule in place gets what a changed
// policy gives, a rule of a new name.
func (c *NodeConfig) renamed() {
	names := map[string]string{}
	for i := range c.State.Spec.Rules {
		r := &c.State.Spec.Rules[i]
		old := r.Name
		r.Name = compile.RuleName(r)
		names[old] = r.Name
	}
	for i := range c.State.Spec.Pods {
		for j, name := range c.State.Spec.Pods[i].Rules {
			if n, ok := names[name]; ok {
				c.State.Spec.Pods[i].Rules[j] = n
			}
		}
	}
}

// AgentConfig is node's configuration with every pod of the node selected by
// rule, as the controller compiles a policy that sets only what rule sets:
// its policy (RuleName when empty), its paths (all NICs with weight 1 when
// empty), DSS checksums on (podMPTCP.dataChecksums' default;
// WithoutDataChecksums turns them off) and its name.
func AgentConfig(b *testbed.Bed, node *testbed.Node, rule mptcpv1alpha1.CompiledRule) *NodeConfig {
	cfg := &NodeConfig{
		Settings: agent.NodeDefaults(NodeName(node)),
		State: &mptcpv1alpha1.MPTCPNodeState{
			TypeMeta:   metav1.TypeMeta{APIVersion: mptcpv1alpha1.GroupVersion.String(), Kind: "MPTCPNodeState"},
			ObjectMeta: metav1.ObjectMeta{Name: NodeName(node)},
			Spec:       mptcpv1alpha1.MPTCPNodeStateSpec{PodCIDRs: []string{node.PodCIDR.String()}},
		},
	}
	// Liveness off unless a test asks (WithLiveness): these agents start
	// one after the other with their peers listed from the start, so a
	// node's first probes would reach a peer whose agent (and the
	// nic_ingress that marks probes) is not there yet, and whose strict
	// rp_filter drops them, which the tests that count such drops see.
	// The controller lists a peer only once its agent has reported.
	cfg.Liveness.Off = true
	cfg.PinDir = filepath.Join(b.PinDir(node), "agent")
	cfg.StateDir = filepath.Join(b.Dir, fmt.Sprintf("agent-node%d", node.Index))
	capacity := resource.MustParse("10G")
	if bps, err := testbed.ParseRate(b.Config.LinkRate); err == nil && bps > 0 {
		capacity = *resource.NewQuantity(int64(bps), resource.DecimalSI)
	}
	for _, nic := range node.NICs {
		cfg.State.Spec.Paths = append(cfg.State.Spec.Paths, mptcpv1alpha1.NodePath{
			Name: PathName(nic.Index), Index: int32(nic.Index),
			Interface: mptcpv1alpha1.InterfaceSelector{Name: nic.Name}, Capacity: capacity,
		})
	}
	if rule.Policy == "" {
		rule.Policy = RuleName
	}
	if rule.PolicyGeneration == 0 {
		rule.PolicyGeneration = 1
	}
	rule.DataChecksums = true
	if len(rule.Paths) == 0 {
		for _, p := range cfg.State.Spec.Paths {
			rule.Paths = append(rule.Paths, mptcpv1alpha1.RulePath{Name: p.Name, Weight: 1})
		}
	}
	cfg.State.Spec.Rules = []mptcpv1alpha1.CompiledRule{rule}
	// Every other node of the bed with pods is a peer, as the controller
	// writes the MPTCPPeers, with its address on each path and its pod
	// CIDR.
	for _, other := range b.Nodes {
		if other == node || len(other.Pods) == 0 {
			continue
		}
		peer := mptcpv1alpha1.MPTCPPeer{ObjectMeta: metav1.ObjectMeta{Name: NodeName(other)},
			Spec: mptcpv1alpha1.MPTCPPeerSpec{PodCIDRs: []string{other.PodCIDR.String()}}}
		for _, nic := range other.NICs {
			peer.Spec.Paths = append(peer.Spec.Paths, mptcpv1alpha1.PeerPath{Name: PathName(nic.Index), Addresses: []string{nic.Addr.Addr().String()}})
		}
		cfg.Peers = append(cfg.Peers, peer)
	}
	for _, pod := range node.Pods {
		cfg.State.Spec.Pods = append(cfg.State.Spec.Pods, mptcpv1alpha1.NodePod{
			Namespace: PodNamespace, Name: pod.Name, UID: pod.Name,
			IPs: []string{pod.Addr.String()}, Rules: []string{rule.Name},
		})
	}
	cfg.renamed()
	return cfg
}

// PathsNamed are rule paths of weight 1, as the controller compiles a
// policy's spread paths without weights.
func PathsNamed(names ...string) []mptcpv1alpha1.RulePath {
	out := make([]mptcpv1alpha1.RulePath, len(names))
	for i, n := range names {
		out[i] = mptcpv1alpha1.RulePath{Name: n, Weight: 1}
	}
	return out
}

// Agent is an agent process running in a node namespace.
type Agent struct {
	Node *testbed.Node
	// ConfigPath is the settings file, StatePath the node state file and
	// PeersPath the peers file (file mode).
	ConfigPath, StatePath, PeersPath string
	Config                           *NodeConfig
	Proc                             *testbed.Process
	// MetricsAddr is where the running agent serves /metrics, /healthz and
	// /readyz, inside the node namespace (a port the agent picked).
	MetricsAddr string
	// MetricsToken is the bearer token Get sends over TLS, for an agent
	// that serves its metrics with -metrics-auth (the chart's default);
	// empty: plain HTTP.
	MetricsToken string
	// Capabilities, when set, are the only ones the agent runs with
	// (setpriv; capability names as in capabilities(7), without "CAP_").
	Capabilities []string
	// release, when set, writes the configuration in the file format of
	// an earlier release, whose binary runs (WithReleaseFormat).
	release func(*NodeConfig) ([]byte, error)
	bin     string
	bed     *testbed.Bed
}

// AgentCapabilities are the capabilities the agent declares
// (agent.Capabilities, which the Helm chart's DaemonSet also grants).
var AgentCapabilities = agent.Capabilities()

// AgentOption changes how StartAgent runs the agent.
type AgentOption func(*Agent)

// WithCapabilities runs the agent (and its -uninstall) as root holding only
// caps: they are its bounding, inheritable, permitted, effective and ambient
// sets, so neither the agent nor anything it executes can hold more.
func WithCapabilities(caps ...string) AgentOption {
	return func(a *Agent) { a.Capabilities = caps }
}

// command is the agent's command line with args.
func (a *Agent) command(args ...string) []string {
	cmd := append([]string{a.bin}, args...)
	if a.Capabilities == nil {
		return cmd
	}
	set := "-all"
	for _, c := range a.Capabilities {
		set += ",+" + strings.ToLower(c)
	}
	return append([]string{"setpriv", "--inh-caps=" + set, "--ambient-caps=" + set, "--bounding-set=" + set, "--"}, cmd...)
}

// Binaries are the programs the bed runs.
type Binaries struct {
	Agent, Traffic string
}

// RunWithBinaries is a TestMain for a package whose tests and benchmarks
// run the bed's programs: it builds them into a temporary directory, sets
// *bins, runs m and removes the directory; it returns the exit code.
func RunWithBinaries(m *testing.M, bins *Binaries) int {
	dir, err := os.MkdirTemp("", "mptcp-binaries-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if *bins, err = BuildBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// BuildBinaries builds cmd/agent and hack/traffic into dir.
func BuildBinaries(dir string) (Binaries, error) {
	b := Binaries{Agent: filepath.Join(dir, "agent"), Traffic: filepath.Join(dir, "traffic")}
	for bin, pkg := range map[string]string{b.Agent: "cmd/agent", b.Traffic: "hack/traffic"} {
		out, err := exec.Command("go", "build", "-o", bin, "github.com/mptcp-operator/mptcp-operator/"+pkg).CombinedOutput()
		if err != nil {
			return b, fmt.Errorf("building %s: %w\n%s", pkg, err, out)
		}
	}
	return b, nil
}

// WithFlapDamping sets the agent's flap damping (settings' flapDamping).
func WithFlapDamping(f agent.FlapDamping) AgentOption {
	return func(a *Agent) {
		if a.Config != nil {
			a.Config.FlapDamping = f
		}
	}
}

// WithLiveness has the agent probe its paths to its peers with the
// defaults (docs/agent.md, "Liveness").
func WithLiveness() AgentOption {
	return func(a *Agent) {
		if a.Config != nil {
			a.Config.Liveness = agent.NodeDefaults(a.Config.Node).Liveness
		}
	}
}

// WithLivenessEvery is WithLiveness probing every interval, a peer Down
// after multiplier intervals without an echo: slow enough for tests that
// run beside others on a loaded machine.
func WithLivenessEvery(interval time.Duration, multiplier int) AgentOption {
	return func(a *Agent) {
		if a.Config != nil {
			a.Config.Liveness = agent.NodeDefaults(a.Config.Node).Liveness
			a.Config.Liveness.Interval = metav1.Duration{Duration: interval}
			a.Config.Liveness.DetectMultiplier = multiplier
		}
	}
}

// WithJoinHoldoff sets how long the joins the agent opens stay backup
// subflows (settings' joinHoldoff); 0 opens them active.
func WithJoinHoldoff(d time.Duration) AgentOption {
	return func(a *Agent) {
		if a.Config != nil {
			a.Config.JoinHoldoff = &metav1.Duration{Duration: d}
		}
	}
}

// WithoutDataChecksums turns DSS checksums off in the rules of the agent's
// node state, as podMPTCP.dataChecksums: false does.
func WithoutDataChecksums() AgentOption {
	return func(a *Agent) {
		if a.Config.State == nil {
			return
		}
		for i := range a.Config.State.Spec.Rules {
			a.Config.State.Spec.Rules[i].DataChecksums = false
		}
	}
}

// WithReleaseFormat has the agent's configuration written as render writes
// it, in one file passed with -config: the file format of an earlier
// release, whose binary the agent runs (an upgrade test). UseBinary goes
// back to this tree's format.
func WithReleaseFormat(render func(*NodeConfig) ([]byte, error)) AgentOption {
	return func(a *Agent) { a.release = render }
}

// StartAgent writes cfg and starts bin in node's namespace, then waits until
// the agent reports its first reconcile.
func StartAgent(ctx context.Context, b *testbed.Bed, bin string, node *testbed.Node, cfg *NodeConfig, opts ...AgentOption) (*Agent, error) {
	a, err := newAgent(b, bin, node, cfg, opts...)
	if err != nil {
		return nil, err
	}
	if err := a.Start(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// newAgent is StartAgent up to the start: its files written.
func newAgent(b *testbed.Bed, bin string, node *testbed.Node, cfg *NodeConfig, opts ...AgentOption) (*Agent, error) {
	a := &Agent{Node: node, Config: cfg, bin: bin, bed: b, ConfigPath: filepath.Join(b.Dir, fmt.Sprintf("agent-node%d.yaml", node.Index)),
		StatePath: filepath.Join(b.Dir, fmt.Sprintf("agent-node%d-state.yaml", node.Index)),
		PeersPath: filepath.Join(b.Dir, fmt.Sprintf("agent-node%d-peers.yaml", node.Index))}
	for _, o := range opts {
		o(a)
	}
	return a, a.WriteConfig(cfg)
}

// WriteConfig replaces the agent's settings and node state files (SIGHUP
// applies them). Rules are named as the controller names them, so a rule
// changed in place takes a new name, as a changed policy's does.
func (a *Agent) WriteConfig(cfg *NodeConfig) error {
	a.Config = cfg
	if a.release != nil {
		b, err := a.release(cfg)
		if err != nil {
			return err
		}
		return os.WriteFile(a.ConfigPath, b, 0o600)
	}
	y, err := yaml.Marshal(cfg.Settings)
	if err != nil {
		return err
	}
	if err := os.WriteFile(a.ConfigPath, y, 0o600); err != nil {
		return err
	}
	if cfg.State == nil {
		return nil // kube mode: the API has the node state
	}
	cfg.renamed()
	if y, err = yaml.Marshal(cfg.State); err != nil {
		return err
	}
	if err := os.WriteFile(a.StatePath, y, 0o600); err != nil {
		return err
	}
	if y, err = yaml.Marshal(mptcpv1alpha1.MPTCPPeerList{Items: cfg.Peers}); err != nil {
		return err
	}
	return os.WriteFile(a.PeersPath, y, 0o600)
}

// Reconfigure writes the agent's configuration as change leaves a copy of
// it, reloads the agent (SIGHUP) and waits for the reconcile that follows.
func (a *Agent) Reconfigure(ctx context.Context, change func(*NodeConfig)) error {
	st, err := a.Status()
	if err != nil {
		return err
	}
	cfg := a.Config.Copy()
	change(cfg)
	if err := a.WriteConfig(cfg); err != nil {
		return err
	}
	if err := a.Reload(); err != nil {
		return err
	}
	_, err = a.WaitReconciles(ctx, st.Reconciles+1)
	return err
}

// Start (re)starts the agent process and waits for its first reconcile.
func (a *Agent) Start(ctx context.Context) error {
	// The status of a previous process stays: the agent reads what it
	// applied. WaitReconciles tells the processes apart by PID.
	// Port 0: each node namespace has its own loopback, and the agent
	// records the port it got in its status.
	args := []string{"-config", a.ConfigPath, "-metrics-addr", "127.0.0.1:0"}
	if a.release == nil {
		args = append(args, "-node-state", a.StatePath, "-peers", a.PeersPath)
	}
	p, err := a.bed.Start(a.Node.NetNS, a.command(args...)...)
	if err != nil {
		return err
	}
	a.Proc = p
	st, err := a.WaitReconciles(ctx, 1)
	a.MetricsAddr = st.MetricsAddress
	return err
}

func (a *Agent) statusPath() string { return filepath.Join(a.Config.StateDir, "status.json") }

// Status reads the agent's status file.
func (a *Agent) Status() (agent.Status, error) {
	var st agent.Status
	b, err := os.ReadFile(a.statusPath())
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

// WaitReconciles waits until the agent has reconciled n times, and returns
// its status; a reconcile error is returned as an error.
func (a *Agent) WaitReconciles(ctx context.Context, n int) (agent.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		st, err := a.Status()
		if err == nil && st.PID == a.Proc.PID && st.Reconciles >= n {
			if st.Error != "" {
				return st, fmt.Errorf("agent on node %d: %s", a.Node.Index, st.Error)
			}
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("agent on node %d did not reconcile (%w); stderr:\n%s", a.Node.Index, ctx.Err(), a.Proc.ErrOutput())
		case <-a.Proc.Done():
			return st, fmt.Errorf("agent on node %d exited; stderr:\n%s", a.Node.Index, a.Proc.ErrOutput())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop ends the agent with SIGTERM; the datapath stays pinned and steering.
func (a *Agent) Stop() error {
	if a.Proc == nil {
		return nil
	}
	return a.Proc.Stop(5 * time.Second)
}

// Uninstall stops the agent and runs `agent -uninstall`, which removes
// everything the agent created on the node.
func (a *Agent) Uninstall(ctx context.Context) error {
	if err := a.Stop(); err != nil {
		return err
	}
	cmd := a.bed.CommandContext(ctx, a.Node.NetNS, a.command("-config", a.ConfigPath, "-uninstall")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("agent -uninstall on node %d: %w\n%s", a.Node.Index, err, out)
	}
	return nil
}

// StartAgents starts one agent per node with the same rule.
func StartAgents(ctx context.Context, b *testbed.Bed, bin string, rule mptcpv1alpha1.CompiledRule, opts ...AgentOption) ([]*Agent, error) {
	return StartAgentsWith(ctx, b, bin, func(*testbed.Node) mptcpv1alpha1.CompiledRule { return rule }, opts...)
}

// StartAgentsWith starts one agent per node, each node's pods selected by
// the rule ruleFor gives.
func StartAgentsWith(ctx context.Context, b *testbed.Bed, bin string, ruleFor func(*testbed.Node) mptcpv1alpha1.CompiledRule, opts ...AgentOption) ([]*Agent, error) {
	prepared := make([]*Agent, len(b.Nodes))
	errs := make([]error, len(b.Nodes))
	for k, n := range b.Nodes {
		prepared[k], errs[k] = newAgent(b, bin, n, AgentConfig(b, n, ruleFor(n)), opts...)
	}
	// Side by side: an agent's start is mostly the verifier's work on its
	// programs, about a second of a core, and a node's agent waits for no
	// other node's.
	var wg sync.WaitGroup
	for k, a := range prepared {
		if errs[k] == nil {
			wg.Go(func() { errs[k] = a.Start(ctx) })
		}
	}
	wg.Wait()
	var agents []*Agent
	for k, a := range prepared {
		if errs[k] == nil {
			agents = append(agents, a)
		}
	}
	return agents, errors.Join(errs...)
}

// UseBinary makes the next Start run bin, which reads this tree's file
// format: an upgrade replaces the agent's binary between a Stop and a
// Start. WriteConfig writes the configuration again in that format.
func (a *Agent) UseBinary(bin string) {
	a.bin = bin
	a.release = nil
}
