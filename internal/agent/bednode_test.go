package agent

import (
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// bedNodeState is the node state of a bed's node "n1" whose every NIC is a
// path of rule (its paths are filled in), selected by pods; with an
// agent's settings pinned under the bed and the node's links as the agent
// finds them.
func bedNodeState(t *testing.T, bed *testbed.Bed, node *testbed.Node, rule mptcpv1alpha1.CompiledRule, pods ...mptcpv1alpha1.NodePod) (Settings, *mptcpv1alpha1.MPTCPNodeState, []NodeLink) {
	t.Helper()
	settings := NodeDefaults("n1")
	settings.PinDir, settings.StateDir = filepath.Join(bed.PinDir(node), "agent"), t.TempDir()
	state := &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	state.Spec.PodCIDRs = []string{node.PodCIDR.String()}
	var links []NodeLink
	rule.Paths = nil
	for _, nic := range node.NICs {
		state.Spec.Paths = append(state.Spec.Paths, mptcpv1alpha1.NodePath{Name: nic.Name, Index: int32(nic.Index),
			Interface: mptcpv1alpha1.InterfaceSelector{Name: nic.Name}})
		links = append(links, NodeLink{Name: nic.Name, Up: true, Gateway: nic.Gateway})
		rule.Paths = append(rule.Paths, mptcpv1alpha1.RulePath{Name: nic.Name})
	}
	state.Spec.Rules = []mptcpv1alpha1.CompiledRule{rule}
	state.Spec.Pods = pods
	return settings, state, links
}

// bedLocate finds node's pods of the bed by address, as LocatePod would.
func bedLocate(node *testbed.Node) func([]netip.Addr) (LocatedPod, error) {
	return func(ips []netip.Addr) (LocatedPod, error) {
		for _, p := range node.Pods {
			if ips[0] == p.Addr {
				return LocatedPod{HostInterface: p.HostIf, NetNS: "/var/run/netns/" + p.NetNS}, nil
			}
		}
		return LocatedPod{}, fmt.Errorf("no pod at %v", ips)
	}
}

// inAgent runs f in node's namespace with an agent of settings started
// there, uninstalled after (an error of that fails the test).
func inAgent(t *testing.T, node *testbed.Node, settings Settings, f func(a *Agent) error) error {
	t.Helper()
	return netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		a, err := New(settings, slog.New(slog.DiscardHandler))
		if err != nil {
			return err
		}
		defer func() {
			if err := a.Uninstall(); err != nil {
				t.Errorf("uninstall: %v", err)
			}
		}()
		return f(a)
	})
}
