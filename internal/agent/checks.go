package agent

import (
	"errors"
	"fmt"

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
	var names []string
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			names = append(names, l.Attrs().Name)
		}
	}
	n, err := cni.Find(s.CNIConfDir, names)
	if err != nil {
		n = cni.Network{Support: cni.Unknown, Note: "reading the CNI configuration: " + err.Error()}
	}
	if s.CNIMarks != nil {
		n.Marks = *s.CNIMarks
	}
	return nodecheck.Run(nodecheck.Node{ProcSys: netnsutil.ProcSys, BTF: kernelBTF, PinDir: s.PinDir, Network: n, MarkMask: s.MarkMask})
}

// Checks are the node checks the agent made when it started.
func (a *Agent) Checks() []mptcpv1alpha1.NodeCheck { return a.checks }

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
