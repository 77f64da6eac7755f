package nodes

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// Calico makes Start run Calico on every node instead of the bed's ptp
// network (TestCNI's Calico row): calico-node's start-up, then felix with
// its iptables data plane on nftables, in the node's network and mount
// namespaces, with the Kubernetes datastore (Calico's CRDs on the bed's API
// server); pods attached by Calico's CNI plugin, which gives each a veth
// cali<hash> with a /32 route to it and hands its Pod's Calico identity to
// felix, which enforces Kubernetes NetworkPolicy on it.
//
// Routed, with no BGP: addresses come from host-local in the node's pod CIDR
// (Calico's IPAM blocks do not follow Node podCIDRs), and the bed's fabrics
// route every pod CIDR, as a fabric that peers with the nodes would. VXLAN:
// calico-ipam gives addresses from an IPPool per node whose one block is the
// node's pod CIDR, felix routes each peer's block through vxlan.calico, and
// on a bed whose fabrics are an underlay the node's VTEP is its loopback
// address, which every fabric routes. felix keeps its default marks
// (0xffff0000), so the agent needs a mark mask outside them.
type Calico struct {
	// Dir holds what `make calico` builds (`make print-calico`):
	// calico-node, the CNI plugin calico, Calico's CRDs (crds/) and its
	// manifest (calico.yaml), whose ClusterRoles the bed grants.
	Dir string
	// Mode is "routed" (the default) or "vxlan".
	Mode string
}

// vxlan tells whether pods' packets between nodes are in Calico's VXLAN.
func (ca *Calico) vxlan() bool { return ca.Mode == "vxlan" }

// CalicoGroup is the group of calico-node's and the CNI plugin's client
// certificates, bound to Calico's own ClusterRoles calico-node and
// calico-cni-plugin.
const CalicoGroup = "testbed:calico"

// CalicoPool is the Calico IPPool of the bed: every node's pod CIDR is in it.
const CalicoPool = "10.244.0.0/16"

// calicoHealthPort is felix's health endpoint, on the node's loopback.
const calicoHealthPort = "9099"

// calicoFiles checks the build and names the node's CNI binary directory:
// the distribution's plugins and Calico's, side by side as containerd wants
// them (one directory).
func calicoFiles(l layout, ca *Calico) error {
	if ca.Mode != "" && ca.Mode != "routed" && ca.Mode != "vxlan" {
		return fmt.Errorf("nodes: Calico's mode %q: want routed or vxlan", ca.Mode)
	}
	for _, f := range []string{"calico-node", "calico", "calico.yaml", "crds"} {
		if _, err := os.Stat(filepath.Join(ca.Dir, f)); err != nil {
			return fmt.Errorf("nodes: Calico: %w: run `make calico`", err)
		}
	}
	return linkCNIBin(l, map[string]string{"calico": filepath.Join(ca.Dir, "calico"), "calico-ipam": filepath.Join(ca.Dir, "calico")})
}

// linkCNIBin makes the node's own CNI binary directory: the distribution's
// plugins and the CNI's (name to binary), side by side as containerd wants
// them (one directory).
func linkCNIBin(l layout, links map[string]string) error {
	dir := l.cniBin()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	plugins, err := os.ReadDir(cniBinDir)
	if err != nil {
		return err
	}
	for _, p := range plugins {
		links[p.Name()] = filepath.Join(cniBinDir, p.Name())
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	return nil
}

// calicoCNIConfig is the conflist Calico's installer writes, with host-local
// in place of calico-ipam: the node's part of its pod CIDR from first to
// last, and felix's policy for Kubernetes NetworkPolicy.
func calicoCNIConfig(n *Node, ca *Calico, kubeconfig string) ([]byte, error) {
	first, last := podRange(n.Bed)
	ipam := map[string]any{
		"type": "host-local",
		"ranges": [][]map[string]string{{{
			"subnet": n.Bed.PodCIDR.String(), "rangeStart": first.String(), "rangeEnd": last.String(),
		}}},
	}
	if ca.vxlan() {
		ipam = map[string]any{"type": "calico-ipam"}
	}
	return json.MarshalIndent(map[string]any{
		"cniVersion": "0.3.1",
		"name":       "k8s-pod-network",
		"plugins": []any{map[string]any{
			"type":                   "calico",
			"datastore_type":         "kubernetes",
			"nodename":               n.Name,
			"nodename_file_optional": true,
			"mtu":                    1500,
			"ipam":                   ipam,
			"policy":                 map[string]string{"type": "k8s"},
			"kubernetes":             map[string]string{"kubeconfig": kubeconfig},
		}},
	}, "", "  ")
}

// startCalico applies Calico's CRDs, its pool and RBAC, runs calico-node's
// start-up and felix on every node and, once felix is ready, writes the
// node's CNI configuration (so the node turns Ready with Calico in place).
func (c *Cluster) startCalico(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ca := c.opts.Calico
	if err := c.calicoObjects(ctx, ca); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := c.assignPodCIDR(ctx, n); err != nil {
			return err
		}
		kubeconfig := n.layout.config("calico.kubeconfig")
		if err := c.opts.ControlPlane.Env.WriteUserKubeconfig(kubeconfig, "calico:"+n.Name, CalicoGroup); err != nil {
			return err
		}
		env := c.calicoEnv(n, kubeconfig)
		steps := [][]string{{"-startup"}}
		if ca.vxlan() {
			steps = append(steps, []string{"-allocate-tunnel-addrs", "-allocate-tunnel-addrs-run-once"})
		}
		for _, step := range steps {
			if out, err := c.inNode(ctx, n, env, append([]string{filepath.Join(ca.Dir, "calico-node")}, step...)...).CombinedOutput(); err != nil {
				return fmt.Errorf("node %s: calico-node %s: %w: %s", n.Name, step[0], err, tailOf(string(out)))
			}
		}
		args := []string{filepath.Join(ca.Dir, "calico-node"), "-felix"}
		p, err := c.opts.Bed.StartCommand(n.Bed.NetNS, args, c.inNode(context.Background(), n, env, args...))
		if err != nil {
			return fmt.Errorf("node %s: felix: %w", n.Name, err)
		}
		n.Felix = p
	}
	for _, n := range c.Nodes {
		if err := waitFelixReady(ctx, n); err != nil {
			return err
		}
		conf, err := calicoCNIConfig(n, ca, n.layout.config("calico.kubeconfig"))
		if err != nil {
			return err
		}
		if err := writeCNIConfig(n, "10-calico.conflist", conf); err != nil {
			return err
		}
	}
	return nil
}

// calicoEnv is calico-node's environment as Calico's DaemonSet sets it,
// without BGP: the node's address from nic1 (its loopback on an underlay,
// the VTEP's address), no default pool (the bed makes its own), the VXLAN
// backend or none, felix on iptables-nft with its health
// endpoint on the loopback, logs to stderr. felix in iptables mode would
// otherwise clean BPF state it finds on the machine: its connect-time load
// balancer's programs on the root cgroup and XDP programs (both off here, as
// on any node that never ran its BPF data plane).
func (c *Cluster) calicoEnv(n *Node, kubeconfig string) []string {
	backend, ip := "none", []string{"IP=autodetect", "IP_AUTODETECTION_METHOD=interface=nic1"}
	if c.opts.Calico.vxlan() {
		backend = "vxlan"
	}
	if c.opts.Bed.Config.Underlay {
		ip = []string{"IP=" + n.Bed.Loopback.String()}
	}
	return append(append(os.Environ(), ip...),
		"DATASTORE_TYPE=kubernetes", "FELIX_DATASTORETYPE=kubernetes", "KUBECONFIG="+kubeconfig,
		"NODENAME="+n.Name, "FELIX_FELIXHOSTNAME="+n.Name, "CALICO_NETWORKING_BACKEND="+backend,
		"NO_DEFAULT_POOLS=true", "CALICO_MANAGE_CNI=false",
		"FELIX_IPTABLESBACKEND=NFT", "FELIX_DEFAULTENDPOINTTOHOSTACTION=ACCEPT",
		"FELIX_USAGEREPORTINGENABLED=false", "FELIX_LOGFILEPATH=none", "FELIX_LOGSEVERITYSCREEN=Warning",
		"FELIX_HEALTHENABLED=true", "FELIX_HEALTHHOST=127.0.0.1", "FELIX_HEALTHPORT="+calicoHealthPort,
		"FELIX_XDPENABLED=false", "FELIX_DebugSkipCTLBCleanup=true",
	)
}

// inNode is a command in the node's network and mount namespaces.
func (c *Cluster) inNode(ctx context.Context, n *Node, env []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--mount=" + n.MountNS(), "--net=/var/run/netns/" + n.Bed.NetNS, "--"}, args...)...)
	cmd.Env = env
	return cmd
}

// waitFelixReady waits until felix's readiness endpoint answers 200: it has
// read the datastore and programmed its data plane once.
func waitFelixReady(ctx context.Context, n *Node) error {
	return waitReady(ctx, n, n.Felix, "felix", func() error { return healthOK(n, calicoHealthPort, "/readiness") })
}

// waitReady polls ready every 200 ms until it returns nil; p, the node's
// process named what, exiting first, or ctx ending, fails with p's log.
func waitReady(ctx context.Context, n *Node, p *testbed.Process, what string, ready func() error) error {
	for {
		last := ready()
		if last == nil {
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("node %s: %s exited: %s", n.Name, what, tailOf(p.Output()+p.ErrOutput()))
		case <-ctx.Done():
			return fmt.Errorf("node %s: %s not ready: %w; its log:\n%s", n.Name, what, last, tailOf(p.Output()+p.ErrOutput()))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// writeCNIConfig puts conf in the node's CNI configuration directory as
// name, whole: the runtime never reads half of it.
func writeCNIConfig(n *Node, name string, conf []byte) error {
	path := n.layout.private("/etc/cni/net.d/" + name)
	if err := os.WriteFile(path+".tmp", conf, 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// healthOK asks a health endpoint on the node's loopback (port, path) and
// wants 200.
func healthOK(n *Node, port, path string) error {
	var conn net.Conn
	err := netnsutil.Do("/var/run/netns/"+n.Bed.NetNS, func() (err error) {
		conn, err = net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), time.Second)
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(conn, "GET "+path+" HTTP/1.0\r\n\r\n"); err != nil {
		return err
	}
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.Contains(status, " 200 ") {
		return fmt.Errorf("%s: %s", path, strings.TrimSpace(status))
	}
	return nil
}

// calicoObjects applies Calico's CRDs and the bed's IPPools and binds
// CalicoGroup to Calico's ClusterRoles.
func (c *Cluster) calicoObjects(ctx context.Context, ca *Calico) error {
	cl := c.opts.ControlPlane.Client
	objs, err := readCRDs(ca.Dir, "calico")
	if err != nil {
		return err
	}
	manifest, err := testenv.ReadObjects(filepath.Join(ca.Dir, "calico.yaml"))
	if err != nil {
		return err
	}
	for _, o := range manifest {
		if o.GetKind() == "ClusterRole" && (o.GetName() == "calico-node" || o.GetName() == "calico-cni-plugin") {
			objs = append(objs, o, calicoBinding(o.GetName()))
		}
	}
	for _, o := range objs {
		if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("nodes: Calico's %s %s: %w", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), err)
		}
	}
	for _, pool := range c.calicoPools() {
		// The CRDs take a moment to be served.
		for {
			err := cl.Create(ctx, pool)
			if err == nil || apierrors.IsAlreadyExists(err) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("nodes: Calico's IPPool %s: %w", pool.GetName(), err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// calicoPools are the bed's IPPools: routed, one for every pod CIDR (no
// IPIP, no VXLAN, no NAT: pods talk with their own addresses); VXLAN, one
// per node, its pod CIDR in a single block, so that calico-ipam's addresses
// are in the Node's podCIDR as the agent expects.
func (c *Cluster) calicoPools() []*unstructured.Unstructured {
	pool := func(name, cidr, selector string, blockSize int, vxlan string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool",
			"metadata": map[string]any{"name": name},
			"spec": map[string]any{
				"cidr": cidr, "blockSize": int64(blockSize), "ipipMode": "Never", "vxlanMode": vxlan,
				"natOutgoing": false, "nodeSelector": selector,
			},
		}}
	}
	if !c.opts.Calico.vxlan() {
		return []*unstructured.Unstructured{pool("testbed", CalicoPool, "all()", 26, "Never")}
	}
	var pools []*unstructured.Unstructured
	for _, n := range c.Nodes {
		cidr := n.Bed.PodCIDR
		pools = append(pools, pool(n.Name, cidr.String(), fmt.Sprintf("kubernetes.io/hostname == '%s'", n.Name), cidr.Bits(), "Always"))
	}
	return pools
}

func calicoBinding(role string) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "testbed-" + role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: CalicoGroup}},
	}
}

// cniBinDir is the directory the node's containerd runs CNI plugins from.
func (c *Cluster) cniBinDir(n *Node) string {
	if c.opts.Calico != nil || c.opts.Cilium != nil {
		return n.layout.cniBin()
	}
	return cniBinDir
}

// readCRDs reads the CRDs a CNI's make target copied into dir/crds (`make
// <target>`).
func readCRDs(dir, target string) ([]client.Object, error) {
	files, err := filepath.Glob(filepath.Join(dir, "crds", "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("nodes: no CRDs in %s: run `make %s`", dir, target)
	}
	var objs []client.Object
	for _, f := range files {
		read, err := testenv.ReadObjects(f)
		if err != nil {
			return nil, err
		}
		for _, o := range read {
			objs = append(objs, o)
		}
	}
	return objs, nil
}
