package agent

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/cni"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/nodecheck"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// ErrMarkClash is what Reconcile returns, having enforced nothing, when the
// node's CNI uses bits of the agent's mark mask: sharing them would rewrite
// the CNI's marks, and the agent's rules would route packets it marked.
var ErrMarkClash = errors.New("mark clash")

// kernelBTF is where the kernel exposes its BTF.
const kernelBTF = "/sys/kernel/btf/vmlinux"

// CheckNode makes the node checks that hold while the agent runs
// (nodecheck.Run): the kernel, BTF, bpffs, and the CNI found in the
// settings' configuration directory with the marks the settings declare
// for it, or its defaults.
func CheckNode(s Settings) []mptcpv1alpha1.NodeCheck {
	_, checks := checkNode(s)
	return checks
}

// checkNode is CheckNode, with the CNI it found.
func checkNode(s Settings) (cni.Network, []mptcpv1alpha1.NodeCheck) {
	n, err := cni.Find(s.CNIConfDir, cniHost())
	if err != nil {
		n = cni.Network{Support: cni.Unknown, Note: "reading the CNI configuration: " + err.Error()}
	}
	if s.CNIMarks != nil {
		// Declared marks are the CNI's configuration; what its
		// encryption takes on top, it takes whatever they say.
		n.Marks = *s.CNIMarks | n.EncryptionMarks
	}
	return n, nodecheck.Run(nodecheck.Node{ProcSys: netnsutil.ProcSys, BTF: kernelBTF, PinDir: s.PinDir, Network: n, MarkMask: s.MarkMask})
}

// cniHost reads what the node's network shows of its CNI: its interfaces,
// which of them hold an address, and whether an xfrm policy matches
// packets by Cilium's IPsec marks. What cannot be read is
// left out: the CNI's mode is then the plainer one.
func cniHost() cni.Host {
	var h cni.Host
	links, err := netlink.LinkList()
	if err != nil {
		return h
	}
	names := make(map[int]string, len(links))
	for _, l := range links {
		h.Links = append(h.Links, l.Attrs().Name)
		names[l.Attrs().Index] = l.Attrs().Name
	}
	if addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL); err == nil {
		for _, a := range addrs {
			if name, ok := names[a.LinkIndex]; ok && !slices.Contains(h.Addressed, name) {
				h.Addressed = append(h.Addressed, name)
			}
		}
	}
	policies, err := netlink.XfrmPolicyList(netlink.FAMILY_ALL)
	h.IPsec = err == nil && slices.ContainsFunc(policies, func(p netlink.XfrmPolicy) bool {
		return p.Mark != nil && cni.CiliumIPsecMark(p.Mark.Value, p.Mark.Mask)
	})
	return h
}

// nodeChecked is what one check of the node found: the checks, the CNI, and
// refused, a mark clash among them, which keeps a reconcile from enforcing.
type nodeChecked struct {
	checks  []mptcpv1alpha1.NodeCheck
	network cni.Network
	refused error
}

func checkNodeNow(s Settings) *nodeChecked {
	n, checks := checkNode(s)
	return &nodeChecked{checks: checks, network: n, refused: refusal(checks)}
}

// Checks are the node checks of the last reconcile (at start, the agent's
// first).
func (a *Agent) Checks() []mptcpv1alpha1.NodeCheck { return slices.Clone(a.node.Load().checks) }

// recheckNode checks the node again, as each reconcile does: a CNI that
// starts after the agent, changes its mode (eBPF host routing, which asks
// for steering at the edge) or turns encryption on (every mark bit) is
// seen at the next reconcile, not the next restart. While a mark clash
// holds, the datapath stops marking (observe-only): programs that are
// attached, a previous release's included, would rewrite the CNI's bits.
func (a *Agent) recheckNode() *nodeChecked {
	node := checkNodeNow(a.settings)
	a.noteNode(node)
	if node.refused != nil {
		if err := a.dp.SetObserveOnly(true); err != nil {
			a.log.Error("stopping the datapath's marks while the CNI's marks clash", "err", err)
		}
	}
	return node
}

// noteNode keeps node as the last check, and logs what changed in it.
func (a *Agent) noteNode(node *nodeChecked) {
	prev := a.node.Swap(node)
	if prev != nil && prev.network == node.network && (prev.refused == nil) == (node.refused == nil) {
		return
	}
	n := node.network
	if node.refused != nil {
		a.log.Error("the CNI's marks share bits with the agent's mark mask: nothing is enforced until they differ",
			"cni", n.Name, "mode", n.Mode, "err", node.refused)
		return
	}
	a.log.Info("node's CNI", "cni", n.Name, "mode", n.Mode, "support", n.Support, "steerAtEdge", n.MayRouteInBPF(),
		"changed", prev != nil)
}

// kernelRefusal is the error of a failed kernel check (a kernel below the
// floor, or without MPTCP): the agent does not load its datapath there, so
// that its start fails with what the kernel lacks rather than with what a
// verifier of another kernel line says of its programs.
func kernelRefusal(checks []mptcpv1alpha1.NodeCheck) error {
	for _, c := range checks {
		if c.Name == nodecheck.Kernel && c.Result == mptcpv1alpha1.CheckFailed {
			return fmt.Errorf("%s: %s", c.Reason, c.Message)
		}
	}
	return nil
}

// refusal is the error of a failed check that keeps the agent from
// enforcing anything: a mark clash.
func refusal(checks []mptcpv1alpha1.NodeCheck) error {
	for _, c := range checks {
		if c.Name == nodecheck.Marks && c.Result == mptcpv1alpha1.CheckFailed {
			return fmt.Errorf("%w: %s", ErrMarkClash, c.Message)
		}
	}
	return nil
}
