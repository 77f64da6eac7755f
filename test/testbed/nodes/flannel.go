package nodes

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// Flannel makes Start run a real flanneld on every node, with flannel's
// Kubernetes subnet manager, instead of the bed's ptp network (TestCNI's
// flannel rows). Each node's flanneld reads its Node's spec.podCIDR (which
// Start assigns as the node IPAM controller would, before flanneld starts: it
// exits on a Node without one), writes its lease into the Node's
// annotations, programs its backend (flannel.1 and FDB and neighbour entries
// for vxlan, routes for host-gw) and writes /run/flannel/subnet.env.
//
// Pods are attached as flannel's CNI plugin attaches them: that plugin
// (github.com/flannel-io/cni-plugin) is not served by the Go module proxy, so
// Start writes the configuration it would delegate to, from subnet.env, as
// a conflist for the distribution's bridge and host-local plugins: bridge
// cni0 as the pods' gateway, host-local in the node's subnet, a route to
// the cluster network, flannel's MTU, no masquerading by the bridge
// (flanneld masquerades, --ip-masq, as kube-flannel runs it).
type Flannel struct {
	// Flanneld is the flanneld binary (`make print-flanneld`).
	Flanneld string
	// Backend is flannel's backend type, "vxlan" or "host-gw".
	Backend string
	// Iface is the interface flanneld sends over (--iface), "nic1" when empty.
	Iface string
	// PublicIP, when set, gives a node's flanneld its --public-ip: the
	// address peers send to (vxlan: the VTEP's address), instead of
	// Iface's. On a bed whose fabrics are an underlay (Config.Underlay) it
	// is the node's Loopback, which every fabric routes, when unset.
	PublicIP func(*testbed.Node) netip.Addr
}

// FlannelNetwork is flannel's cluster network: every bed node's pod CIDR,
// 10.244.i.0/24, is in it.
var FlannelNetwork = netip.MustParsePrefix("10.244.0.0/16")

// flannelSubnetFile is where flanneld writes its lease on the node (the node
// sees its own copy: hostDirs).
const flannelSubnetFile = "/run/flannel/subnet.env"

// flannelNetConf is flannel's net-conf.json, what kube-flannel's ConfigMap
// holds.
func flannelNetConf(f *Flannel) ([]byte, error) {
	return json.MarshalIndent(map[string]any{
		"Network":        FlannelNetwork.String(),
		"EnableNFTables": false,
		"Backend":        map[string]any{"Type": f.Backend},
	}, "", "  ")
}

// FlannelEnv is what flanneld wrote to subnet.env.
type FlannelEnv struct {
	Network, Subnet netip.Prefix
	MTU             int
	IPMasq          bool
}

// ReadFlannelEnv parses the node's subnet.env.
func (n *Node) ReadFlannelEnv() (FlannelEnv, error) {
	var e FlannelEnv
	f, err := os.Open(n.layout.private(flannelSubnetFile))
	if err != nil {
		return e, err
	}
	defer f.Close()
	kv := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = v
		}
	}
	if e.Network, err = netip.ParsePrefix(kv["FLANNEL_NETWORK"]); err != nil {
		return e, fmt.Errorf("FLANNEL_NETWORK: %w", err)
	}
	if e.Subnet, err = netip.ParsePrefix(kv["FLANNEL_SUBNET"]); err != nil {
		return e, fmt.Errorf("FLANNEL_SUBNET: %w", err)
	}
	if e.MTU, err = strconv.Atoi(kv["FLANNEL_MTU"]); err != nil {
		return e, fmt.Errorf("FLANNEL_MTU: %w", err)
	}
	e.IPMasq = kv["FLANNEL_IPMASQ"] == "true"
	return e, nil
}

// flannelCNIConfig is the configuration flannel's CNI plugin delegates to
// (its defaults with kube-flannel's delegate options hairpinMode and
// isDefaultGateway): bridge cni0, the pod's gateway, addresses of the node's
// flannel subnet, a route to the cluster network, masquerading by the
// bridge only when flanneld does none.
func flannelCNIConfig(e FlannelEnv) ([]byte, error) {
	return json.MarshalIndent(map[string]any{
		"cniVersion": "0.4.0",
		"name":       "cbr0",
		"plugins": []any{map[string]any{
			"type":             "bridge",
			"bridge":           "cni0",
			"isGateway":        true,
			"isDefaultGateway": true,
			"hairpinMode":      true,
			"ipMasq":           !e.IPMasq,
			"mtu":              e.MTU,
			"ipam": map[string]any{
				"type":   "host-local",
				"ranges": [][]map[string]string{{{"subnet": e.Subnet.Masked().String()}}},
				"routes": []map[string]string{{"dst": e.Network.String()}},
			},
		}},
	}, "", "  ")
}

// startFlannel gives every Node its pod CIDR, starts flanneld on every node
// and, once it has written subnet.env, the node's CNI configuration.
func (c *Cluster) startFlannel(ctx context.Context) error {
	f := c.opts.Flannel
	iface := f.Iface
	if iface == "" {
		iface = "nic1"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, n := range c.Nodes {
		if err := c.assignPodCIDR(ctx, n); err != nil {
			return err
		}
	}
	if err := c.flannelRBAC(ctx); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		kubeconfig := n.layout.config("flannel.kubeconfig")
		if err := c.opts.ControlPlane.Env.WriteUserKubeconfig(kubeconfig, "flannel:"+n.Name, FlannelGroup); err != nil {
			return err
		}
		args := []string{f.Flanneld,
			"--kube-subnet-mgr",
			"--kubeconfig-file", kubeconfig,
			"--net-config-path", n.layout.config("flannel-net-conf.json"),
			"--subnet-file", flannelSubnetFile,
			"--iface", iface,
			"--ip-masq",
			"--v=2",
		}
		if f.PublicIP != nil {
			args = append(args, "--public-ip", f.PublicIP(n.Bed).String())
		} else if c.opts.Bed.Config.Underlay {
			args = append(args, "--public-ip", n.Bed.Loopback.String())
		}
		cmd := c.inNode(context.Background(), n, append(os.Environ(), "NODE_NAME="+n.Name), args...)
		p, err := c.opts.Bed.StartCommand(n.Bed.NetNS, args, cmd)
		if err != nil {
			return fmt.Errorf("node %s: flanneld: %w", n.Name, err)
		}
		n.Flanneld = p
	}
	for _, n := range c.Nodes {
		var env FlannelEnv
		if err := waitReady(ctx, n, n.Flanneld, "flanneld", func() (err error) {
			env, err = n.ReadFlannelEnv()
			return err
		}); err != nil {
			return err
		}
		conf, err := flannelCNIConfig(env)
		if err != nil {
			return err
		}
		if err := writeCNIConfig(n, "10-flannel.conflist", conf); err != nil {
			return err
		}
	}
	return nil
}

// FlannelGroup is the group of every node's flanneld client certificate,
// which the ClusterRole flannel is bound to. Not the kubelet's identity: the
// Node authorizer lets a node read its own Node object only ("node '...'
// cannot read all nodes, only its own Node object"), and flanneld lists and
// watches them all.
const FlannelGroup = "testbed:flannel"

// flannelRBAC grants flanneld what kube-flannel.yml's ClusterRole grants
// its service account: read pods, read and watch nodes, patch their status
// (its lease is in the Node's annotations).
func (c *Cluster) flannelRBAC(ctx context.Context) error {
	cl := c.opts.ControlPlane.Client
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "testbed-flannel"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "testbed-flannel"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: FlannelGroup}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("flannel's RBAC: %w", err)
		}
	}
	return nil
}

// flannelFiles are the node's flannel configuration files, by path.
func flannelFiles(l layout, f *Flannel) (map[string][]byte, error) {
	conf, err := flannelNetConf(f)
	if err != nil {
		return nil, err
	}
	if f.Flanneld == "" || (f.Backend != "vxlan" && f.Backend != "host-gw") {
		return nil, fmt.Errorf("nodes: flannel needs a flanneld binary and the backend vxlan or host-gw, got %+v", *f)
	}
	if _, err := os.Stat(f.Flanneld); err != nil {
		return nil, fmt.Errorf("nodes: flanneld: %w: run `make flanneld`", err)
	}
	if _, err := os.Stat(filepath.Join(cniBinDir, "bridge")); err != nil {
		return nil, fmt.Errorf("nodes: CNI plugin bridge not in %s", cniBinDir)
	}
	return map[string][]byte{l.config("flannel-net-conf.json"): conf}, nil
}
