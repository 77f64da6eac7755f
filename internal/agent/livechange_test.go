package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// Every field of a rule, changed while its pod runs, reaches the pod with
// the next reconcile, without a restart: the datapath rule its new
// connections take (read back from the maps through the pod's selector
// chain), its caps, and what the agent set up inside the pod's namespace
// (path manager, limits, signal endpoints, DSS checksums, and the joins its
// running path manager opens per connection). Each step changes one field
// under a new rule name, as the controller names a changed rule.
func TestEveryRuleFieldReachesRunningPods(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 3, PodsPerNode: 1})
	node, pod := bed.Node(1), bed.Node(1).Pods[0]
	podNS := "/var/run/netns/" + pod.NetNS
	cfg := NodeDefaults("n1")
	cfg.PinDir, cfg.StateDir = filepath.Join(bed.PinDir(node), "agent"), t.TempDir()
	cfg.PodCIDRs = []netip.Prefix{node.PodCIDR}
	for _, nic := range node.NICs {
		cfg.Paths = append(cfg.Paths, Path{Name: nic.Name, Index: uint32(nic.Index), Interface: nic.Name, Gateway: nic.Gateway})
	}
	paths := map[string]Path{}
	for _, p := range cfg.Paths {
		paths[p.Name] = p
	}
	rate := resource.MustParse("30M")
	steps := []struct {
		name   string
		change func(*Rule)
		check  func(t *testing.T, a *Agent, r Rule) // beyond the datapath rule, which every step checks
	}{
		{"start: maxSubflows 2 over three paths", func(r *Rule) {}, func(t *testing.T, a *Agent, r Rule) { wantJoins(t, a, 1) }},
		{"maxSubflows 4", func(r *Rule) { r.MaxSubflows = 4 }, func(t *testing.T, a *Agent, r Rule) { wantJoins(t, a, 2) }},
		{"paths", func(r *Rule) { r.Paths = []string{"nic3", "nic1"} }, func(t *testing.T, a *Agent, r Rule) { wantJoins(t, a, 1) }},
		{"spreadMode and weights", func(r *Rule) { r.SpreadMode, r.Weights = "weighted", map[string]uint32{"nic3": 3} }, nil},
		{"preferredPaths", func(r *Rule) { r.PreferredPaths = []string{"nic3"} }, nil},
		{"traffic", func(r *Rule) {
			r.Traffic = &Traffic{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, Ports: []PortRange{{First: 5201, Last: 5299}}, Family: "IPv4"}
		}, nil},
		{"headerRewriting and backupPaths", func(r *Rule) { r.HeaderRewriting, r.BackupPaths = true, []string{"nic2"} }, nil},
		{"blockedPaths", func(r *Rule) { r.BackupPaths, r.BlockedPaths = nil, []string{"nic2"} }, nil},
		{"rateLimits", func(r *Rule) { r.Rate = &RateLimits{Mode: "police", PerConnection: &rate, Direction: "egress"} },
			func(t *testing.T, a *Agent, r Rule) {
				c, ok, err := a.dp.RateRuleAt(chainOf(t, a, pod.Addr)[0])
				if err != nil || !ok || c.Mode != datapath.RatePolice || c.PerConnection != 30_000_000 || c.Directions != datapath.Egress {
					t.Errorf("caps of the pod's rule %+v (%v, %v), want police 30 Mbit/s egress", c, ok, err)
				}
			}},
		{"dataChecksums", func(r *Rule) { r.DataChecksums = true }, func(t *testing.T, a *Agent, r Rule) {
			wantSysctl(t, podNS, "net.mptcp.checksum_enabled", "1")
		}},
		{"subflowCreation signal", func(r *Rule) { r.Subflows, r.SignalPorts = SubflowsSignal, []uint16{6001} },
			func(t *testing.T, a *Agent, r Rule) {
				wantSysctl(t, podNS, "net.mptcp.path_manager", "kernel")
				wantLimits(t, podNS, mptcpnl.Limits{Subflows: 1, AddAddrAccepted: 1})
				if out, err := bed.Command(pod.NetNS, "ip", "mptcp", "endpoint", "show").CombinedOutput(); err != nil || !strings.Contains(string(out), "port 6001") {
					t.Errorf("pod's endpoints %q (%v), want one signalling port 6001", out, err)
				}
				if len(a.creators) != 0 {
					t.Errorf("%d path managers run, want none in signal mode", len(a.creators))
				}
			}},
		{"subflowCreation guest", func(r *Rule) { r.Subflows, r.SignalPorts = SubflowsNone, nil },
			func(t *testing.T, a *Agent, r Rule) {
				wantSysctl(t, podNS, "net.mptcp.path_manager", "kernel")
				wantLimits(t, podNS, mptcpnl.Limits{Subflows: 2})
				if out, err := bed.Command(pod.NetNS, "ip", "mptcp", "endpoint", "show").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
					t.Errorf("pod's endpoints %q (%v), want none: the guest's stack is its own", out, err)
				}
			}},
	}
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		a, err := New(&cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			return err
		}
		defer func() {
			if err := a.Uninstall(); err != nil {
				t.Errorf("uninstall: %v", err)
			}
		}()
		rule := Rule{Paths: []string{"nic1", "nic2", "nic3"}, Subflows: SubflowsUserspace, MaxSubflows: 2}
		for i, s := range steps {
			s.change(&rule)
			rule.Name = "r-" + strings.ReplaceAll(s.name, " ", "-")
			next := cfg
			next.Rules = []Rule{rule}
			next.Pods = []Pod{{Name: "apps.p", NetNS: podNS, HostInterface: pod.HostIf, IPs: []netip.Addr{pod.Addr}, Rule: rule.Name}}
			if err := a.Reconcile(context.Background(), &next); err != nil {
				t.Errorf("step %d (%s): reconcile: %v", i, s.name, err)
				continue
			}
			want, err := rule.datapathRule(paths)
			if err != nil {
				return err
			}
			got, err := a.dp.RuleAt(chainOf(t, a, pod.Addr)[0])
			if err != nil {
				return err
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("step %d (%s): the pod's new connections take rule %+v, want %+v", i, s.name, got, want)
			}
			if s.check != nil {
				s.check(t, a, rule)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// chainOf is the selector chain the datapath holds for addr.
func chainOf(t *testing.T, a *Agent, addr netip.Addr) []uint32 {
	t.Helper()
	chains, err := a.dp.EndpointRules()
	if err != nil || len(chains[addr]) == 0 {
		t.Fatalf("no rules for %v (%v): %v", addr, err, chains)
	}
	return chains[addr]
}

func wantJoins(t *testing.T, a *Agent, n int) {
	t.Helper()
	if len(a.creators) != 1 {
		t.Fatalf("%d path managers run, want the pod's", len(a.creators))
	}
	for _, c := range a.creators {
		if got := int(c.joins.Load()); got != n {
			t.Errorf("the pod's running path manager opens %d joins per connection, want %d", got, n)
		}
	}
}

func wantSysctl(t *testing.T, ns, key, want string) {
	t.Helper()
	if got, err := netnsutil.ReadSysctl(ns, key); err != nil || got != want {
		t.Errorf("%s in the pod is %q (%v), want %q", key, got, err, want)
	}
}

func wantLimits(t *testing.T, ns string, want mptcpnl.Limits) {
	t.Helper()
	fd, err := netnsutil.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFD(fd)
	c, err := mptcpnl.Dial(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := c.GetLimits(); err != nil || got != want {
		t.Errorf("the pod's MPTCP limits %+v (%v), want %+v", got, err, want)
	}
}
