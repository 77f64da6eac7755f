// Package nodecheck is the agent's checks of its node: what the product
// needs from the kernel, BTF, bpffs, the CNI and its marks, and the node's
// pod CIDRs. The agent publishes them in its MPTCPNodeState's status, and
// kubectl mptcp preflight shows them with the troubleshooting entry of each
// failed one (docs/troubleshooting.md).
package nodecheck

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/cni"
)

// Check names, in the order they are made.
const (
	Kernel   = "Kernel"
	BTF      = "BTF"
	BPFFS    = "BPFFS"
	CNI      = "CNI"
	Marks    = "Marks"
	PodCIDRs = "PodCIDRs"
)

// Reasons of failed checks; each is an entry of docs/troubleshooting.md.
const (
	ReasonNoMPTCP     = "NoMPTCP"
	ReasonKernelOld   = "KernelTooOld"
	ReasonNoBTF       = "NoBTF"
	ReasonNoBPFFS     = "NoBPFFS"
	ReasonCNIUntested = "CNIUntested"
	ReasonCNIUnknown  = "CNIUnknown"
	ReasonMarkClash   = mptcpv1alpha1.ReasonMarkClash
	ReasonNoPodCIDRs  = mptcpv1alpha1.ReasonNoPodCIDRs
)

// Node is what the node checks read: the agent's settings and where the
// node's files are.
type Node struct {
	// ProcSys is a view of the host's /proc/sys (netnsutil.ProcSys).
	ProcSys string
	// BTF is the kernel's BTF (/sys/kernel/btf/vmlinux).
	BTF string
	// PinDir is where the agent pins; the filesystem holding it must be
	// bpffs.
	PinDir string
	// Network is the CNI found (cni.Find), with its marks as the settings
	// declare them.
	Network cni.Network
	// MarkMask is the agent's.
	MarkMask uint32
}

// Run makes the checks of a node that do not change while the agent runs.
func Run(n Node) []mptcpv1alpha1.NodeCheck {
	return []mptcpv1alpha1.NodeCheck{kernel(n.ProcSys), btf(n.BTF), bpffs(n.PinDir), network(n.Network), marks(n.Network, n.MarkMask)}
}

func passed(name, format string, args ...any) mptcpv1alpha1.NodeCheck {
	return mptcpv1alpha1.NodeCheck{Name: name, Result: mptcpv1alpha1.CheckPassed, Message: fmt.Sprintf(format, args...)}
}

func failed(name, reason, format string, args ...any) mptcpv1alpha1.NodeCheck {
	return mptcpv1alpha1.NodeCheck{Name: name, Result: mptcpv1alpha1.CheckFailed, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// MinKernel is the oldest kernel line the datapath runs on: TCX links
// came with 6.6, and 6.1's verifier refuses its programs (a map key in
// memory a global function was given). docs/install.md's matrix says which
// kernels ran.
var MinKernel = [2]int{6, 6}

func kernel(procSys string) mptcpv1alpha1.NodeCheck {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return kernelRelease("", procSys)
	}
	return kernelRelease(unix.ByteSliceToString(u.Release[:]), procSys)
}

// kernelRelease checks the kernel of a release (uname -r; "" when unknown)
// whose /proc/sys is procSys.
func kernelRelease(r, procSys string) mptcpv1alpha1.NodeCheck {
	release := strings.TrimSpace("Linux " + r)
	var major, minor int
	if n, _ := fmt.Sscanf(r, "%d.%d", &major, &minor); n == 2 && (major < MinKernel[0] || major == MinKernel[0] && minor < MinKernel[1]) {
		return failed(Kernel, ReasonKernelOld, "%s is older than %d.%d, the oldest kernel the datapath runs on (TCX links; a verifier that accepts its programs)",
			release, MinKernel[0], MinKernel[1])
	}
	if _, err := os.Stat(filepath.Join(procSys, "net", "mptcp", "enabled")); err != nil {
		return failed(Kernel, ReasonNoMPTCP, "%s has no MPTCP (%s/net/mptcp/enabled: %v): the node needs a kernel built with CONFIG_MPTCP", release, procSys, err)
	}
	return passed(Kernel, "%s, with MPTCP", release)
}

func btf(path string) mptcpv1alpha1.NodeCheck {
	if _, err := os.Stat(path); err != nil {
		return failed(BTF, ReasonNoBTF, "%v: the datapath's programs need the kernel's BTF (CONFIG_DEBUG_INFO_BTF)", err)
	}
	return passed(BTF, "%s", path)
}

// bpfFSMagic is Linux's BPF_FS_MAGIC, spelled here because x/sys/unix defines
// it on Linux only and the kubectl plugin, which imports this package, is
// also built for darwin.
const bpfFSMagic = 0xcafe4a11

// bpffs checks the filesystem of the pin directory, or of its nearest
// existing parent before the agent made it.
func bpffs(pinDir string) mptcpv1alpha1.NodeCheck {
	dir := pinDir
	for {
		var st unix.Statfs_t
		err := unix.Statfs(dir, &st)
		if err == nil {
			if st.Type != bpfFSMagic {
				return failed(BPFFS, ReasonNoBPFFS, "%s is not on a bpffs: pinned programs would not outlive the agent (mount bpffs at /sys/fs/bpf on the host)", dir)
			}
			return passed(BPFFS, "%s is on bpffs", dir)
		}
		parent := filepath.Dir(dir)
		if !errors.Is(err, unix.ENOENT) || parent == dir {
			return failed(BPFFS, ReasonNoBPFFS, "%s: %v", dir, err)
		}
		dir = parent
	}
}

func network(n cni.Network) mptcpv1alpha1.NodeCheck {
	c := mptcpv1alpha1.NodeCheck{Name: CNI, Message: n.String()}
	if n.File != "" {
		c.Message += " from " + n.File
	}
	c.Message += ": " + n.Note
	switch n.Support {
	case cni.Tested:
		c.Result = mptcpv1alpha1.CheckPassed
	case cni.Untested:
		c.Result, c.Reason = mptcpv1alpha1.CheckWarning, ReasonCNIUntested
	default:
		c.Result, c.Reason = mptcpv1alpha1.CheckWarning, ReasonCNIUnknown
	}
	return c
}

// marks fails when the CNI's marks and the agent's mask share a bit: the
// agent would rewrite the CNI's marks and its rules would route packets the
// CNI marked. It suggests a mask both leave free.
func marks(n cni.Network, mask uint32) mptcpv1alpha1.NodeCheck {
	name := n.Name
	if name == "" {
		name = "the CNI"
	}
	if shared := n.Marks & mask; shared != 0 {
		msg := fmt.Sprintf("%s uses skb->mark bits 0x%08x, which share 0x%08x with the agent's mark mask 0x%08x: the agent enforces nothing until they differ. ",
			name, n.Marks, shared, mask)
		switch free, alone := cni.FreeMask(n.Marks, true), cni.FreeMask(n.Marks, false); {
		case free != 0:
			msg += fmt.Sprintf("Set the chart's agent.markMask to bits %s and kube-proxy (0x%08x) leave free, e.g. 0x%08x", name, cni.KubeProxyMarks, free)
		case alone != 0:
			msg += fmt.Sprintf("%s and kube-proxy (0x%08x) leave no four bits free; where kube-proxy does not run, set the chart's agent.markMask to 0x%08x", name, cni.KubeProxyMarks, alone)
		default:
			msg += fmt.Sprintf("%s leaves no four bits free", name)
		}
		return failed(Marks, ReasonMarkClash, "%s, or agent.cni.marks if %s's marks are not its defaults", msg, name)
	}
	return passed(Marks, "the agent's mask 0x%08x; %s uses 0x%08x", mask, name, n.Marks)
}

// NodePodCIDRs checks the pod CIDRs the controller copied from the Node
// into its MPTCPNodeState: without them the rule that keeps traffic
// between the node's own pods off the paths is missing.
func NodePodCIDRs(cidrs []string) mptcpv1alpha1.NodeCheck {
	if len(cidrs) == 0 {
		return failed(PodCIDRs, ReasonNoPodCIDRs, "the Node has no spec.podCIDRs: traffic between the node's own pods may take a path, and peers cannot detour round a path that is down to this node "+
			"(the controller manager's --allocate-node-cidrs, or the CNI's IPAM, sets them)")
	}
	return passed(PodCIDRs, "%s", strings.Join(cidrs, ", "))
}

// Summary is the NodeSupported condition of checks: False with the first
// failed check's reason, else True (Warnings when one warns).
func Summary(checks []mptcpv1alpha1.NodeCheck) (status bool, reason, message string) {
	var warned []string
	for _, c := range checks {
		switch c.Result {
		case mptcpv1alpha1.CheckFailed:
			return false, c.Reason, c.Name + ": " + c.Message
		case mptcpv1alpha1.CheckWarning:
			warned = append(warned, c.Name+": "+c.Message)
		}
	}
	if len(warned) > 0 {
		return true, mptcpv1alpha1.ReasonChecksWarned, strings.Join(warned, "; ")
	}
	return true, mptcpv1alpha1.ReasonChecksPassed, "every check passed"
}
