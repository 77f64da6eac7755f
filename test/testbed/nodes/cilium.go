package nodes

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// Cilium makes Start run cilium-agent on every node instead of the bed's ptp
// network, in the node's network and mount namespaces, with Cilium's CRDs on
// the bed's API server and no operator: IPAM "kubernetes" (the Node's
// podCIDR), identities allocated by the agents (CRD mode), kube-proxy
// replacement, masquerading, the L7 proxy, health checking and the socket
// load balancer off. Pods are attached by cilium-cni, each behind a veth
// lxc<hash> with the agent's BPF programs on it.
//
// Native routing: the node routes pod packets by its own tables (host
// legacy routing), and the bed's fabrics route every pod CIDR. VXLAN: the
// agent's cilium_vxlan device, with the peers' addresses as the tunnel
// endpoints.
//
// What the agent would change outside the node: it writes the kernel's
// unprivileged_bpf_disabled (1, which cannot be undone until a reboot) and
// timer_migration (0); both are shadowed in the node's mount namespace by
// files that hold these values (kernelTunables), so it writes nothing.
// net.core.bpf_jit_enable is not in a network namespace's sysctls: it only
// warns. It detaches programs of the socket load balancer's attach types
// from its cgroup root even with the load balancer off, and would mount the
// machine's cgroup v2 root there: its cgroup root is the node's own cgroup,
// bind-mounted at its default path. Its BPF pins are in the node's bpffs.
type Cilium struct {
	// Dir holds what `make cilium` builds (`make print-cilium`):
	// cilium-agent, cilium-cni, Cilium's CRDs (crds/) and the sources of
	// its BPF datapath (bpf/), which the agent compiles at run time.
	Dir string
	// Mode is "native" (the default) or "vxlan".
	Mode string
	// BPFHostRouting turns Cilium's eBPF host routing on (its default on a
	// kernel that has it): its programs on the pods' interfaces send their
	// packets to the NIC their FIB lookup picks, past the node's policy
	// routing. Off, the bed runs legacy host routing through the stack.
	BPFHostRouting bool
	// Clang is a clang of LLVM 18 or later; "/usr/bin/clang-19" (Debian's
	// clang-19) if empty.
	Clang string
}

// CiliumGroup is the group of the agents' client certificates.
const CiliumGroup = "testbed:cilium"

// CiliumNetwork is what every node's pod CIDR is in: the native routing
// CIDR, which the agent does not masquerade.
const CiliumNetwork = "10.244.0.0/16"

// ciliumHealthPort is the agent's health endpoint, on the node's loopback.
const ciliumHealthPort = "9879"

// ciliumConflist is where the agent writes the node's CNI configuration once
// it is ready, inside the node's mount namespace.
const ciliumConflist = "/etc/cni/net.d/05-cilium.conflist"

func (ci *Cilium) vxlan() bool { return ci.Mode == "vxlan" }

func (ci *Cilium) clang() string {
	if ci.Clang != "" {
		return ci.Clang
	}
	return "/usr/bin/clang-19"
}

// ciliumFiles checks the build and the compiler, and makes the node's CNI
// binary directory (cilium-cni beside the distribution's plugins) and a
// directory whose clang is Cilium's, first in the agent's PATH (the
// machine's clang is older).
func ciliumFiles(l layout, ci *Cilium) error {
	for _, f := range []string{"cilium-agent", "cilium-cni", "crds", "bpf/bpf_lxc.c"} {
		if _, err := os.Stat(filepath.Join(ci.Dir, f)); err != nil {
			return fmt.Errorf("nodes: Cilium: %w: run `make cilium`", err)
		}
	}
	if _, err := os.Stat(ci.clang()); err != nil {
		return fmt.Errorf("nodes: Cilium needs clang >= 18: %w (Debian's clang-19)", err)
	}
	if err := linkCNIBin(l, map[string]string{"cilium-cni": filepath.Join(ci.Dir, "cilium-cni")}); err != nil {
		return err
	}
	bin := filepath.Join(l.dir, "cilium-bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	if err := os.Symlink(ci.clang(), filepath.Join(bin, "clang")); err != nil && !os.IsExist(err) {
		return err
	}
	return nil
}

// startCilium applies Cilium's CRDs and RBAC and starts the agent on every
// node; the agent writes the node's CNI configuration when it is ready, so
// the node turns Ready with Cilium in place.
func (c *Cluster) startCilium(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	ci := c.opts.Cilium
	if err := c.ciliumObjects(ctx, ci); err != nil {
		return err
	}
	cgroup2, err := cgroup2Root()
	if err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := c.assignPodCIDR(ctx, n); err != nil {
			return err
		}
		kubeconfig := n.layout.config("cilium.kubeconfig")
		if err := c.opts.ControlPlane.Env.WriteUserKubeconfig(kubeconfig, "cilium:"+n.Name, CiliumGroup); err != nil {
			return err
		}
		args := append([]string{filepath.Join(ci.Dir, "cilium-agent")}, c.ciliumArgs(n, kubeconfig)...)
		// The cgroup root: the node's cgroup in the v2 hierarchy, a mount
		// of cgroup2 at the agent's default path, private to the node
		// (/run/cilium is one of its hostDirs).
		script := fmt.Sprintf("set -e\nmkdir -p /run/cilium/cgroupv2\nmount --bind %s /run/cilium/cgroupv2\nexec \"$@\"\n",
			shellQuote(filepath.Join(cgroup2, n.Cgroup)))
		env := append(os.Environ(), "PATH="+filepath.Join(n.layout.dir, "cilium-bin")+":"+os.Getenv("PATH"),
			"K8S_NODE_NAME="+n.Name, "CILIUM_K8S_NAMESPACE=kube-system")
		cmd := c.inNode(context.Background(), n, env, append([]string{"sh", "-c", script, "cilium-agent"}, args...)...)
		p, err := c.opts.Bed.StartCommand(n.Bed.NetNS, args, cmd)
		if err != nil {
			return fmt.Errorf("node %s: cilium-agent: %w", n.Name, err)
		}
		n.CiliumAgent = p
	}
	for _, n := range c.Nodes {
		if err := waitCiliumReady(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// ciliumArgs are the agent's flags on node n.
func (c *Cluster) ciliumArgs(n *Node, kubeconfig string) []string {
	ci := c.opts.Cilium
	var devices []string
	for _, nic := range n.Bed.NICs {
		devices = append(devices, nic.Name)
	}
	args := []string{
		"--k8s-kubeconfig-path=" + kubeconfig,
		"--ipam=kubernetes", "--k8s-require-ipv4-pod-cidr=true",
		"--enable-ipv4=true", "--enable-ipv6=false",
		// eBPF host routing needs kube-proxy replacement, or the agent
		// falls back to legacy host routing.
		"--kube-proxy-replacement=" + strconv.FormatBool(ci.BPFHostRouting), "--bpf-lb-sock=false",
		// Even without kube-proxy replacement the agent translates
		// ClusterIPs in its pods' programs: 10.0.0.1:443 would go to the
		// kubernetes Endpoints' address, which no node reaches, and not to
		// the bed's relay on the node's loopback. It handles only services
		// labelled with this proxy name: none.
		"--k8s-service-proxy-name=testbed-none",
		"--enable-ipv4-masquerade=false", "--enable-bpf-masquerade=false",
		"--enable-host-legacy-routing=" + strconv.FormatBool(!ci.BPFHostRouting),
		"--identity-allocation-mode=crd",
		// The agent otherwise writes its pods' identity over the whole of
		// skb->mark when it passes their packets to the stack, clearing the
		// bits a program before it set (the product's mark mask, outside
		// Cilium's 0xffff0fff): the policy routing that steers subflows
		// then sees none. Each node finds a pod's identity by its address.
		"--enable-identity-mark=false",
		"--enable-l7-proxy=false", "--enable-hubble=false",
		"--enable-health-checking=false", "--enable-endpoint-health-checking=false",
		"--agent-health-port=" + ciliumHealthPort,
		"--devices=" + strings.Join(devices, ","),
		"--write-cni-conf-when-ready=" + ciliumConflist, "--cni-exclusive=false",
		"--lib-dir=" + ci.Dir, "--state-dir=/run/cilium", "--bpf-root=/sys/fs/bpf",
		"--cgroup-root=/run/cilium/cgroupv2",
	}
	if ci.vxlan() {
		return append(args, "--routing-mode=tunnel", "--tunnel-protocol=vxlan")
	}
	return append(args, "--routing-mode=native", "--ipv4-native-routing-cidr="+CiliumNetwork)
}

// cgroup2Root is where the machine's cgroup v2 hierarchy is mounted.
func cgroup2Root() (string, error) {
	hs, err := testbed.CgroupHierarchies()
	if err != nil {
		return "", err
	}
	for _, h := range hs {
		var st unix.Statfs_t
		if unix.Statfs(h, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return h, nil
		}
	}
	return "", fmt.Errorf("nodes: Cilium: no cgroup v2 hierarchy among %v", hs)
}

// waitCiliumReady waits until the agent's health endpoint answers 200 (it
// has compiled and loaded its datapath) and it has written the node's CNI
// configuration, which it does early, before its datapath is up.
func waitCiliumReady(ctx context.Context, n *Node) error {
	return waitReady(ctx, n, n.CiliumAgent, "cilium-agent", func() error {
		if err := healthOK(n, ciliumHealthPort, "/healthz"); err != nil {
			return err
		}
		_, err := os.Stat(n.layout.private(ciliumConflist))
		return err
	})
}

// ciliumObjects applies Cilium's CRDs and a ClusterRole for the agents,
// bound to CiliumGroup.
func (c *Cluster) ciliumObjects(ctx context.Context, ci *Cilium) error {
	cl := c.opts.ControlPlane.Client
	objs, err := readCRDs(ci.Dir, "cilium")
	if err != nil {
		return err
	}
	read := []string{"get", "list", "watch"}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "testbed-cilium"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"namespaces", "services", "pods", "nodes", "endpoints", "secrets", "configmaps"}, Verbs: read},
			{APIGroups: []string{""}, Resources: []string{"nodes", "nodes/status", "pods", "pods/status"}, Verbs: []string{"patch", "update"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
			{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: read},
			{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, Verbs: read},
			{APIGroups: []string{"cilium.io"}, Resources: []string{"*"}, Verbs: []string{"*"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "testbed-cilium"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: CiliumGroup}},
	}
	objs = append(objs, role, binding)
	for _, o := range objs {
		if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("nodes: Cilium's %s %s: %w", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), err)
		}
	}
	return nil
}
