package nodes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// A real node runs its containerd and kubelet in a mount namespace of its own
// (unshare --mount --propagation slave), in which the node's private
// directories are bind-mounted at the standard paths of a Kubernetes host.
// The kubelet, containerd, the CNI plugins and every hostPath volume of the
// node's pods (the chart's agent DaemonSet) then see a machine of their own:
// no test-only path reaches the chart. Nothing mounted in a node's namespace
// propagates back to the machine's (slave propagation), and all of it goes
// away with the namespace when the node's last process exits.
//
// The machine's /sys stays: runc needs its cgroup mounts (which is also why
// the node's processes enter the node's network namespace with nsenter, not
// "ip netns exec", which mounts a new sysfs).

// hostDirs are the standard paths a node gets privately: each is the bind
// mount of <node state dir><path>, made shared inside the node's namespace so
// that pods may ask for HostToContainer or Bidirectional propagation of it
// (the agent's view of /var/run/netns follows the pods CNI adds).
var hostDirs = []string{
	"/run/netns",          // pod network namespaces that containerd creates (cni-<uuid>)
	"/run/containerd",     // containerd's state and socket, the shims' sockets, runc's state
	"/run/mptcp-operator", // the agent's state (internal/agent DefaultStateRoot)
	"/var/lib/containerd", // containerd's root: content store, overlayfs snapshots
	"/var/lib/kubelet",    // the kubelet's root: pods' volumes, its certificates, checkpoints
	"/var/lib/cni",        // host-local IPAM's allocations
	"/var/log/pods",       // container logs, which tests read (Node.ContainerLog)
	"/var/log/containers", // the kubelet's links to them
	"/etc/cni/net.d",      // the node's CNI configuration (ptp + host-local)
	"/run/flannel",        // flanneld's subnet.env, with Options.Flannel
	"/var/lib/calico",     // calico-node's nodename and felix's MTU file, with Options.Calico
	"/var/log/calico",     // calico-node's start-up creates it
	"/run/calico",         // the Calico CNI plugin's IPAM lock
	"/run/cilium",         // cilium-agent's state, API socket and cgroup root, with Options.Cilium
}

// kernelTunables are the machine-wide sysctls the kubelet sets to values of
// its own at start (pkg/kubelet/cm setupKernelTunables) unless they already
// have them, or refuses to start with protectKernelDefaults, and the two
// cilium-agent writes the same way (Options.Cilium). A test must not change
// the machine's kernel settings, so inside a node's mount namespace each is
// shadowed by a file holding the value they want: they find them set and
// write nothing. Nothing in the tests depends on them (overcommit, what the
// kernel does on panic and oops, unprivileged BPF, timer migration).
var kernelTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
	// cilium-agent's (Options.Cilium): it writes them unless they have
	// these values; 1 locks unprivileged BPF off until a reboot.
	"kernel/unprivileged_bpf_disabled": "1",
	"kernel/timer_migration":           "0",
}

// layout is where one node keeps its state on the machine.
type layout struct {
	// dir is the node's state directory (testbed.Bed.NodeStateDir).
	dir string
	// pins is the node's bpffs directory, the bed's PinDir, which the node
	// sees at /sys/fs/bpf.
	pins string
}

// private is the machine's path of the node's private copy of a standard path.
func (l layout) private(path string) string { return filepath.Join(l.dir, path) }

// cniBin is the node's own CNI plugin directory, when its CNI's plugins
// are not the distribution's (Options.Calico).
func (l layout) cniBin() string { return filepath.Join(l.dir, "cni-bin") }

// config is the machine's path of a configuration file of the node.
func (l layout) config(name string) string { return filepath.Join(l.dir, "config", name) }

// create makes the node's directories, the files that shadow kernel
// tunables, and the standard paths as empty mount points on the machine when
// they are missing (they stay: other nodes and later runs mount on them).
func (l layout) create() error {
	dirs := []string{l.config(""), filepath.Join(l.dir, "sysctl"), filepath.Join(l.dir, "opt")}
	for _, d := range hostDirs {
		dirs = append(dirs, l.private(d), d)
	}
	for _, d := range dirs {
		// Another bed's Sweep may remove the shared NodeStateRoot when it
		// finds it empty, while this MkdirAll walks down: try again then.
		var err error
		for range 3 {
			if err = os.MkdirAll(d, 0o755); !errors.Is(err, fs.ErrNotExist) {
				break
			}
		}
		if err != nil {
			return err
		}
	}
	for k, v := range kernelTunables {
		if err := os.WriteFile(l.tunable(k), []byte(v+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (l layout) tunable(key string) string {
	return filepath.Join(l.dir, "sysctl", strings.ReplaceAll(key, "/", "."))
}

// mountScript is the shell script that sets the node's mount namespace up
// and then execs its arguments (containerd). It runs inside the new mount
// namespace, so every mount it makes stays there.
func (l layout) mountScript() string {
	var b strings.Builder
	b.WriteString("set -e\n")
	// "/" shared, as on a systemd host: containerd looks for the mount that
	// holds a hostPath literally, without following symlinks, so the
	// HostToContainer propagation of /var/run/netns (/var/run -> /run) is
	// checked against "/", which must be shared or a slave. The namespace's
	// "/" joins no peer group of the machine's: nothing propagates back.
	b.WriteString("mount --make-shared /\n")
	bind := func(src, dst string, shared bool) {
		fmt.Fprintf(&b, "mount --bind %s %s\n", shellQuote(src), shellQuote(dst))
		if shared {
			fmt.Fprintf(&b, "mount --make-shared %s\n", shellQuote(dst))
		}
	}
	for _, d := range hostDirs {
		bind(l.private(d), d, true)
	}
	// The machine's bpffs is private, and so is its copy here: containerd
	// checks a HostToContainer mount of /sys/fs/bpf (the chart's agent)
	// against the first mount at that path, the copy under the node's
	// bind, which must be shared or a slave. Shared here, it joins a peer
	// group of this namespace only.
	b.WriteString("mount --make-shared /sys/fs/bpf\n")
	bind(l.pins, "/sys/fs/bpf", true)
	// A kernel may lack one (timer_migration needs NO_HZ_COMMON): then
	// there is nothing to write and nothing to shadow.
	for k := range kernelTunables {
		fmt.Fprintf(&b, "if [ -e %s ]; then mount --bind %s %s; fi\n",
			shellQuote("/proc/sys/"+k), shellQuote(l.tunable(k)), shellQuote("/proc/sys/"+k))
	}
	b.WriteString(`exec "$@"` + "\n")
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
