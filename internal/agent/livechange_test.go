package agent

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// Every field of a rule, changed while its pod runs, reaches the pod with
// the next reconcile, without a restart: the datapath rule its new
// connections take (read back from the maps through the pod's selector
// chain), its caps, and what the agent set up inside the pod's namespace
// (path manager, limits, signal endpoints, DSS checksums, congestion
// control, and the joins its running path manager opens per connection).
// Each step changes one field under the same rule name, as the controller
// keeps a changed policy's name: the agent rewrites the rule in place,
// under the datapath id it already had.
func TestEveryRuleFieldReachesRunningPods(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 3, PodsPerNode: 1})
	node, pod := bed.Node(1), bed.Node(1).Pods[0]
	podNS := "/var/run/netns/" + pod.NetNS
	settings := NodeDefaults("n1")
	settings.PinDir, settings.StateDir = filepath.Join(bed.PinDir(node), "agent"), t.TempDir()
	state := &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	state.Spec.PodCIDRs = []string{node.PodCIDR.String()}
	var links []NodeLink
	for _, nic := range node.NICs {
		state.Spec.Paths = append(state.Spec.Paths, mptcpv1alpha1.NodePath{Name: nic.Name, Index: int32(nic.Index),
			Interface: mptcpv1alpha1.InterfaceSelector{Name: nic.Name}})
		links = append(links, NodeLink{Name: nic.Name, Up: true, Gateway: nic.Gateway})
	}
	locate := func(ips []netip.Addr) (LocatedPod, error) {
		if len(ips) == 0 || ips[0] != pod.Addr {
			return LocatedPod{}, fmt.Errorf("no pod at %v", ips)
		}
		return LocatedPod{HostInterface: pod.HostIf, NetNS: podNS}, nil
	}
	rate := resource.MustParse("30M")
	steps := []struct {
		name   string
		change func(*mptcpv1alpha1.CompiledRule)
		check  func(t *testing.T, a *Agent) // beyond the datapath rule, which every step checks
	}{
		{"start: maxSubflows 2 over three paths", func(r *mptcpv1alpha1.CompiledRule) {}, func(t *testing.T, a *Agent) { wantJoins(t, a, 1) }},
		{"maxSubflows 4", func(r *mptcpv1alpha1.CompiledRule) { r.MaxSubflows = 4 }, func(t *testing.T, a *Agent) { wantJoins(t, a, 2) }},
		{"paths", func(r *mptcpv1alpha1.CompiledRule) {
			r.Paths = []mptcpv1alpha1.RulePath{{Name: "nic3"}, {Name: "nic1"}}
		},
			func(t *testing.T, a *Agent) { wantJoins(t, a, 1) }},
		{"spreadMode and weights", func(r *mptcpv1alpha1.CompiledRule) {
			r.SpreadMode, r.Paths = mptcpv1alpha1.SpreadWeighted, []mptcpv1alpha1.RulePath{{Name: "nic3", Weight: 3}, {Name: "nic1", Weight: 1}}
		}, nil},
		{"preferredPaths", func(r *mptcpv1alpha1.CompiledRule) { r.PreferredPaths = []string{"nic3"} }, nil},
		{"traffic", func(r *mptcpv1alpha1.CompiledRule) {
			r.Traffic = &mptcpv1alpha1.TrafficMatch{CIDRs: []string{"10.244.0.0/16"},
				Ports: []mptcpv1alpha1.PortRange{{Port: 5201, EndPort: 5299}}, Family: mptcpv1alpha1.IPFamilyIPv4}
		}, nil},
		{"headerRewriting and backupPaths", func(r *mptcpv1alpha1.CompiledRule) { r.HeaderRewriting, r.BackupPaths = true, []string{"nic2"} }, nil},
		{"blockedPaths", func(r *mptcpv1alpha1.CompiledRule) { r.BackupPaths, r.BlockedPaths = nil, []string{"nic2"} }, nil},
		{"rateLimits", func(r *mptcpv1alpha1.CompiledRule) {
			r.RateLimits = &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModePolice, PerConnection: &rate, Direction: mptcpv1alpha1.RateEgress}
		}, func(t *testing.T, a *Agent) {
			c, ok, err := a.dp.RateRuleAt(chainOf(t, a, pod.Addr)[0])
			if err != nil || !ok || c.Mode != datapath.RatePolice || c.PerConnection != 30_000_000 || c.Directions != datapath.Egress {
				t.Errorf("caps of the pod's rule %+v (%v, %v), want police 30 Mbit/s egress", c, ok, err)
			}
		}},
		{"dataChecksums", func(r *mptcpv1alpha1.CompiledRule) { r.DataChecksums = true }, func(t *testing.T, a *Agent) {
			wantSysctl(t, podNS, "net.mptcp.checksum_enabled", "1")
		}},
		{"congestionControl", func(r *mptcpv1alpha1.CompiledRule) { r.CongestionControl = "reno" }, func(t *testing.T, a *Agent) {
			wantSysctl(t, podNS, "net.ipv4.tcp_congestion_control", "reno")
		}},
		{"subflowCreation signal", func(r *mptcpv1alpha1.CompiledRule) {
			r.SubflowCreation, r.SignalPorts = mptcpv1alpha1.SubflowCreationSignal, []int32{6001}
		}, func(t *testing.T, a *Agent) {
			wantSysctl(t, podNS, "net.mptcp.path_manager", "kernel")
			wantLimits(t, podNS, mptcpnl.Limits{Subflows: 1, AddAddrAccepted: 1})
			if out, err := bed.Command(pod.NetNS, "ip", "mptcp", "endpoint", "show").CombinedOutput(); err != nil || !strings.Contains(string(out), "port 6001") {
				t.Errorf("pod's endpoints %q (%v), want one signalling port 6001", out, err)
			}
			if n := a.pms.Len(); n != 0 {
				t.Errorf("%d path managers run, want none in signal mode", n)
			}
		}},
		{"subflowCreation guest", func(r *mptcpv1alpha1.CompiledRule) {
			r.SubflowCreation, r.SignalPorts = mptcpv1alpha1.SubflowCreationGuest, nil
		}, func(t *testing.T, a *Agent) {
			wantSysctl(t, podNS, "net.mptcp.path_manager", "kernel")
			wantLimits(t, podNS, mptcpnl.Limits{Subflows: 2})
			if out, err := bed.Command(pod.NetNS, "ip", "mptcp", "endpoint", "show").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
				t.Errorf("pod's endpoints %q (%v), want none: the guest's stack is its own", out, err)
			}
		}},
	}
	err := inAgent(t, node, settings, func(a *Agent) error {
		rule := mptcpv1alpha1.CompiledRule{Policy: "p", Paths: []mptcpv1alpha1.RulePath{{Name: "nic1"}, {Name: "nic2"}, {Name: "nic3"}},
			SpreadMode: mptcpv1alpha1.SpreadRoundRobin, SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace, MaxSubflows: 2}
		rule.Name = "p"
		var firstID uint32
		for i, s := range steps {
			s.change(&rule)
			next := state.DeepCopy()
			next.Spec.Rules = []mptcpv1alpha1.CompiledRule{rule}
			next.Spec.Pods = []mptcpv1alpha1.NodePod{{Namespace: "apps", Name: "p", IPs: []string{pod.Addr.String()}, Rules: []string{rule.Name}}}
			tr := FromNodeState(settings, next, nil, links, locate, Prior{})
			if len(tr.Errors) > 0 || len(tr.Plan.Rules) != 1 {
				t.Fatalf("step %d (%s): translation: %v, %d rules", i, s.name, tr.Errors, len(tr.Plan.Rules))
			}
			if failed, err := a.Reconcile(context.Background(), tr.Plan); err != nil || len(failed) > 0 {
				t.Errorf("step %d (%s): reconcile: %v, pods failed %+v", i, s.name, err, failed)
				continue
			}
			id := chainOf(t, a, pod.Addr)[0]
			if i == 0 {
				firstID = id
			} else if id != firstID {
				t.Errorf("step %d (%s): the rule moved from datapath id %d to %d; a changed rule keeps its id", i, s.name, firstID, id)
			}
			got, err := a.dp.RuleAt(id)
			if err != nil {
				return err
			}
			if want := tr.Plan.Rules[0].Datapath; !reflect.DeepEqual(got, want) {
				t.Errorf("step %d (%s): the pod's new connections take rule %+v, want %+v", i, s.name, got, want)
			}
			if s.check != nil {
				s.check(t, a)
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
	if a.pms.Len() != 1 {
		t.Fatalf("%d path managers run, want the pod's", a.pms.Len())
	}
	if got, _ := a.pms.Joins(a.Pods()[0]); got != n {
		t.Errorf("the pod's running path manager opens %d joins per connection, want %d", got, n)
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
