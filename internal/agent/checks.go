package agent

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/cni"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/nodecheck"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/routing"
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
	return checkNode(s).checks
}

// nodeChecked is what one check of the node found: the checks, the CNI, and
// refused, a mark clash among them, which keeps a reconcile from enforcing.
// unread says why the CNI's configuration or the node's links could not be
// read whole: the CNI then looks plainer than it may be.
type nodeChecked struct {
	checks  []mptcpv1alpha1.NodeCheck
	network cni.Network
	refused error
	unread  error
}

// checkNode checks the node (CheckNode), with the CNI it found.
func checkNode(s Settings) *nodeChecked {
	h, unread := cniHost()
	n, err := cni.Find(s.CNIConfDir, h)
	if err != nil {
		n = cni.Network{Support: cni.Unknown, Note: "reading the CNI configuration: " + err.Error(),
			Marks: n.EncryptionMarks, EncryptionMarks: n.EncryptionMarks}
		unread = errors.Join(unread, err)
	}
	if s.CNIMarks != nil {
		// Declared marks are the CNI's configuration; what its
		// encryption takes on top, it takes whatever they say.
		n.Marks = *s.CNIMarks | n.EncryptionMarks
	}
	checks := nodecheck.Run(nodecheck.Node{ProcSys: netnsutil.ProcSys, BTF: kernelBTF, PinDir: s.PinDir, Network: n, MarkMask: s.MarkMask})
	return &nodeChecked{checks: checks, network: n, refused: refusal(checks), unread: unread}
}

// cniHost reads what the node's network shows of its CNI: its interfaces,
// which of them hold an address, and whether an xfrm policy matches
// packets by Cilium's IPsec marks. What cannot be read is left out (the
// CNI's mode is then the plainer one) and said in the error. A kernel
// without xfrm has no IPsec to read.
func cniHost() (cni.Host, error) {
	var h cni.Host
	links, err := dump(netlink.LinkList)
	if err != nil {
		return h, fmt.Errorf("listing links: %w", err)
	}
	names := make(map[int]string, len(links))
	for _, l := range links {
		h.Links = append(h.Links, l.Attrs().Name)
		names[l.Attrs().Index] = l.Attrs().Name
	}
	addrs, err := dump(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return h, fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		if name, ok := names[a.LinkIndex]; ok && !slices.Contains(h.Addressed, name) {
			h.Addressed = append(h.Addressed, name)
		}
	}
	policies, err := dump(func() ([]netlink.XfrmPolicy, error) { return netlink.XfrmPolicyList(netlink.FAMILY_ALL) })
	if err != nil && !errors.Is(err, unix.EPROTONOSUPPORT) && !errors.Is(err, unix.EOPNOTSUPP) {
		return h, fmt.Errorf("listing xfrm policies: %w", err)
	}
	h.IPsec = err == nil && slices.ContainsFunc(policies, func(p netlink.XfrmPolicy) bool {
		return p.Mark != nil && cni.CiliumIPsecMark(p.Mark.Value, p.Mark.Mask)
	})
	return h, nil
}

// dump runs a netlink dump again while the kernel interrupts it: the list
// changed as it was read (pods come and go), and what came back is partial.
func dump[T any](list func() ([]T, error)) ([]T, error) {
	const tries = 5
	var (
		out []T
		err error
	)
	for range tries {
		if out, err = list(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return out, err
}

// A check that relaxes the one in force (a clash over, or the CNI or its
// mode changed) stands only once confirmChecks checks in a row have found
// it over at least confirmSpan: one check that misses what a CNI is
// rewriting (its configuration, its encryption device) must not let the
// agent write bits the CNI uses, or take nic_egress off the NICs, until
// the next resync. Reconciles can come milliseconds apart (link events),
// hence the span as well as the count. A clash found stands at once.
const (
	confirmChecks = 2
	confirmSpan   = 10 * time.Second
)

// pendingCheck is a relaxing check seen but not yet confirmed.
type pendingCheck struct {
	network cni.Network
	checks  int
	since   time.Time
}

// Checks are the node checks of the last reconcile (at start, the agent's
// first).
func (a *Agent) Checks() []mptcpv1alpha1.NodeCheck { return slices.Clone(a.node.Load().checks) }

// recheckNode checks the node again, as each reconcile does: a CNI that
// starts after the agent, changes its mode (eBPF host routing, which asks
// for steering at the edge) or turns encryption on (every mark bit) is
// seen within a resync, not at the next restart. A check that could not
// read the node whole leaves the last one standing; one that relaxes the
// last stands once confirmed (confirmChecks).
func (a *Agent) recheckNode() *nodeChecked {
	prev, node := a.node.Load(), checkNode(a.settings)
	switch {
	case node.unread != nil && node.refused == nil:
		// A partial read can miss mark bits, never add them: a clash
		// it finds stands, the absence of one does not.
		if msg := node.unread.Error(); msg != a.lastUnread {
			a.log.Warn("the node's CNI could not be read whole: the last check stands", "err", node.unread)
			a.lastUnread = msg
		}
		node = prev
	case node.refused != nil || prev.refused == nil && prev.network == node.network:
		a.pending = pendingCheck{}
	case !a.confirmed(node.network, time.Now()):
		node = prev
	}
	a.noteNode(node)
	return node
}

// confirmed counts a check that found network, relaxing the last, and says
// whether it is confirmed: confirmChecks in a row found it, over at least
// the agent's confirmSpan.
func (a *Agent) confirmed(network cni.Network, now time.Time) bool {
	if a.pending.checks == 0 || a.pending.network != network {
		a.pending = pendingCheck{network: network, since: now}
	}
	a.pending.checks++
	if a.pending.checks < confirmChecks || now.Sub(a.pending.since) < a.confirmSpan {
		return false
	}
	a.pending = pendingCheck{}
	return true
}

// noteNode keeps node as the last check, and logs what changed in it.
func (a *Agent) noteNode(node *nodeChecked) {
	prev := a.node.Swap(node)
	if prev == node || prev != nil && prev.network == node.network && (prev.refused == nil) == (node.refused == nil) {
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

// stopForClash keeps the node from acting on marks while its CNI's share
// the agent's bits: the datapath stops marking (observe-only: programs
// already attached, a previous agent's included, would rewrite the CNI's
// bits) and the paths' fwmark rules go (they would route packets by the
// CNI's bits). The first reconcile after the clash puts the rules back,
// then the marks (heldForClash).
func (a *Agent) stopForClash() error {
	a.heldForClash = true
	return errors.Join(a.dp.SetObserveOnly(true), routing.Sync(a.ranges(), routing.Want{}, a.dp.Mark))
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
