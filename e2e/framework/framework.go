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
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
)

// PathName names the path of NIC k: fabric-a, fabric-b, ...
func PathName(k int) string { return fmt.Sprintf("fabric-%c", 'a'+k-1) }

// RuleName is the rule every bed pod is selected by.
const RuleName = "spread"

// AgentConfig is node's configuration with every pod of the node selected by
// rule (whose Name and Paths are filled in when empty: all NICs).
func AgentConfig(b *testbed.Bed, node *testbed.Node, rule agent.Rule) *agent.Config {
	cfg := &agent.Config{
		Node:     filepath.Base(node.NetNS),
		PinDir:   filepath.Join(b.PinDir(node), "agent"),
		StateDir: filepath.Join(b.Dir, fmt.Sprintf("agent-node%d", node.Index)),
		PodCIDRs: []netip.Prefix{node.PodCIDR},
	}
	for _, nic := range node.NICs {
		cfg.Paths = append(cfg.Paths, agent.Path{
			Name:      PathName(nic.Index),
			Index:     uint32(nic.Index),
			Interface: nic.Name,
			Gateway:   nic.Gateway,
		})
	}
	if rule.Name == "" {
		rule.Name = RuleName
	}
	if len(rule.Paths) == 0 {
		for _, p := range cfg.Paths {
			rule.Paths = append(rule.Paths, p.Name)
		}
	}
	cfg.Rules = []agent.Rule{rule}
	for _, pod := range node.Pods {
		cfg.Pods = append(cfg.Pods, agent.Pod{
			Name:          pod.Name,
			NetNS:         "/var/run/netns/" + pod.NetNS,
			HostInterface: pod.HostIf,
			IPs:           []netip.Addr{pod.Addr},
			Rule:          rule.Name,
		})
	}
	return cfg
}

// Agent is an agent process running in a node namespace.
type Agent struct {
	Node       *testbed.Node
	ConfigPath string
	Config     *agent.Config
	Proc       *testbed.Process
	// MetricsAddr is where the running agent serves /metrics, /healthz and
	// /readyz, inside the node namespace (a port the agent picked).
	MetricsAddr string
	// Capabilities, when set, are the only ones the agent runs with
	// (setpriv; capability names as in capabilities(7), without "CAP_").
	Capabilities []string
	// kubeArgs, when set, run the agent in kube mode (StartKubeAgent).
	kubeArgs []string
	bin      string
	bed      *testbed.Bed
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

// StartAgent writes cfg and starts bin in node's namespace, then waits until
// the agent reports its first reconcile.
func StartAgent(ctx context.Context, b *testbed.Bed, bin string, node *testbed.Node, cfg *agent.Config, opts ...AgentOption) (*Agent, error) {
	a := &Agent{Node: node, Config: cfg, bin: bin, bed: b, ConfigPath: filepath.Join(b.Dir, fmt.Sprintf("agent-node%d.yaml", node.Index))}
	for _, o := range opts {
		o(a)
	}
	if err := a.WriteConfig(cfg); err != nil {
		return nil, err
	}
	if err := a.Start(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// WriteConfig replaces the agent's configuration file (SIGHUP applies it).
func (a *Agent) WriteConfig(cfg *agent.Config) error {
	y, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	a.Config = cfg
	return os.WriteFile(a.ConfigPath, y, 0o600)
}

// Reconfigure writes the agent's configuration as change leaves a copy of
// it, reloads the agent (SIGHUP) and waits for the reconcile that follows.
func (a *Agent) Reconfigure(ctx context.Context, change func(*agent.Config)) error {
	st, err := a.Status()
	if err != nil {
		return err
	}
	cfg := *a.Config
	change(&cfg)
	if err := a.WriteConfig(&cfg); err != nil {
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
	p, err := a.bed.Start(a.Node.NetNS, a.command(append([]string{"-config", a.ConfigPath, "-metrics-addr", "127.0.0.1:0"}, a.kubeArgs...)...)...)
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
func StartAgents(ctx context.Context, b *testbed.Bed, bin string, rule agent.Rule, opts ...AgentOption) ([]*Agent, error) {
	return StartAgentsWith(ctx, b, bin, func(*testbed.Node) agent.Rule { return rule }, opts...)
}

// StartAgentsWith starts one agent per node, each node's pods selected by
// the rule ruleFor gives.
func StartAgentsWith(ctx context.Context, b *testbed.Bed, bin string, ruleFor func(*testbed.Node) agent.Rule, opts ...AgentOption) ([]*Agent, error) {
	var agents []*Agent
	var errs []error
	for _, n := range b.Nodes {
		a, err := StartAgent(ctx, b, bin, n, AgentConfig(b, n, ruleFor(n)), opts...)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		agents = append(agents, a)
	}
	return agents, errors.Join(errs...)
}

// UseBinary makes the next Start run bin: an upgrade replaces the agent's
// binary between a Stop and a Start.
func (a *Agent) UseBinary(bin string) { a.bin = bin }
