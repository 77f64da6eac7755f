// Package nodes runs real Kubernetes nodes in a test bed: in every bed node's
// network namespace, a containerd with runc and the CNI plugins ptp,
// host-local and loopback (the distribution's packages) and a kubelet built
// from k8s.io/kubernetes, registered with the bed's API server
// (test/testbed/controlplane started with Options.Cluster). Images are
// imported from archives; nothing is pulled. Pods get routed veths with
// addresses of the node's pod CIDR, which the bed's fabrics route, so their
// traffic crosses the bed's NICs. See docs/testbed.md, "Real nodes".
package nodes

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/controlplane"
)

// LabelMultipath is on every node of the bed, so that the
// MPTCPPaths of examples/ (nodeSelector mptcp.io/multipath=true) select them.
const LabelMultipath = "mptcp.io/multipath"

// Tools are the programs a real node needs on the machine besides the
// kubelet: containerd (with its runc shim), runc, ctr to import images, and
// nsenter and unshare (util-linux) to enter the node's namespaces.
var Tools = []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter", "unshare", "mount"}

// CNIPlugins are the CNI plugins a node's containerd runs, from cniBinDir.
var CNIPlugins = []string{"ptp", "host-local", "loopback"}

// Image is an image archive to import into every node's containerd.
type Image struct {
	// Ref is the image's fully qualified name (registry/path:tag), which pods
	// use; containerd would prefix a short name with docker.io/.
	Ref string
	// Archive is an OCI or docker-save tar of it.
	Archive string
}

// Options configure Start.
type Options struct {
	// Bed is the test bed whose nodes become real nodes.
	Bed *testbed.Bed
	// ControlPlane was started with Options.Cluster.
	ControlPlane *controlplane.ControlPlane
	// Assets is the directory holding the kubelet binary
	// (KUBEBUILDER_ASSETS after `make node-assets`).
	Assets string
	// Images are imported into every node before its kubelet starts.
	Images []Image
	// SandboxImage is the pause image's reference; it must be among Images.
	SandboxImage string
	// Labels are added to every Node (the kubelet's --node-labels), besides
	// LabelMultipath=true.
	Labels map[string]string
	// Flannel, when set, runs flanneld on every node and attaches pods to
	// its bridge instead of the bed's ptp network (flannel.go).
	Flannel *Flannel
	// Calico, when set, runs calico-node and felix on every node and
	// attaches pods with Calico's CNI plugin instead (calico.go).
	Calico *Calico
	// Cilium, when set, runs cilium-agent on every node and attaches pods
	// with Cilium's CNI plugin instead (cilium.go).
	Cilium *Cilium
	// Registry, when set (host:port), is a registry each node's containerd
	// pulls from over plain HTTP, as from a mirror inside the cluster.
	Registry string
}

// Cluster is the real nodes of a bed. Stop it with Stop.
type Cluster struct {
	opts  Options
	Nodes []*Node
	// narrowCC lets go of the congestion control the cluster's pods are
	// allowed (testbed.AllowCongestionControl); nil once let go.
	narrowCC func() error
}

// Node is one real node.
type Node struct {
	Bed *testbed.Node
	// Name is the Node's name: the bed node's namespace name.
	Name string
	// Dir is the node's state directory on the machine; the node sees its
	// subdirectories at the standard paths (Dir+"/var/lib/kubelet" is its
	// /var/lib/kubelet).
	Dir string
	// Cgroup is the kubelet's cgroup root, in every hierarchy.
	Cgroup string
	// Containerd and Kubelet are the node's processes; Flanneld too with
	// Options.Flannel, Felix with Options.Calico, CiliumAgent with
	// Options.Cilium.
	Containerd, Kubelet, Flanneld, Felix, CiliumAgent *testbed.Process

	layout  layout
	mountNS string // the node's mount namespace, as readlink /proc/PID/ns/mnt shows it
	// mountNSRef holds the node's mount namespace open until Stop has
	// checked that no process is left in it: while it is held, its number
	// cannot be given to another namespace, so that matching processes by
	// it never finds (and stops) anyone else's.
	mountNSRef *os.File
}

// Socket is the machine's path of the node's containerd socket.
func (n *Node) Socket() string { return n.layout.private("/run/containerd/containerd.sock") }

// MountNS is the path of the node's mount namespace (that of its
// containerd), for nsenter --mount.
func (n *Node) MountNS() string { return fmt.Sprintf("/proc/%d/ns/mnt", n.Containerd.PID) }

// Start turns every node of the bed into a real node and waits until every
// Node is Ready. On error everything it started is stopped.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if o.Bed == nil || o.ControlPlane == nil {
		return nil, errors.New("nodes: Bed and ControlPlane are required")
	}
	if o.ControlPlane.ServingCA() == nil {
		return nil, errors.New("nodes: the control plane was not started with Options.Cluster")
	}
	if err := checkPrerequisites(o); err != nil {
		return nil, err
	}
	c = &Cluster{opts: o}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Stop())
			c = nil
		}
	}()
	// The product's agent gives pods cubic (podMPTCP.congestionControl's
	// default) and adds it to the node's allowed list from the node's
	// namespace; a bed's agents run in namespaces of their own, which
	// cannot, so the bed adds it for them.
	if c.narrowCC, err = testbed.AllowCongestionControl("cubic"); err != nil {
		return c, err
	}
	for _, bn := range o.Bed.Nodes {
		n := &Node{
			Bed: bn, Name: bn.NetNS, Dir: o.Bed.NodeStateDir(bn), Cgroup: o.Bed.NodeCgroup(bn),
			layout: layout{dir: o.Bed.NodeStateDir(bn), pins: o.Bed.PinDir(bn)},
		}
		c.Nodes = append(c.Nodes, n)
		if err := c.prepare(ctx, n); err != nil {
			return c, fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := c.startContainerd(ctx, n); err != nil {
			return c, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	// Images and kubelets after every containerd: the imports of one node
	// overlap the start of the next.
	for _, n := range c.Nodes {
		if err := c.importImages(ctx, n); err != nil {
			return c, fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := c.startKubelet(n); err != nil {
			return c, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if o.Flannel != nil {
		if err := c.startFlannel(ctx); err != nil {
			return c, err
		}
	}
	if o.Calico != nil {
		if err := c.startCalico(ctx); err != nil {
			return c, err
		}
	}
	if o.Cilium != nil {
		if err := c.startCilium(ctx); err != nil {
			return c, err
		}
	}
	return c, c.WaitReady(ctx)
}

func checkPrerequisites(o Options) error {
	for _, t := range Tools {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("nodes: %s not found: install the packages of hack/install-deps.sh", t)
		}
	}
	for _, p := range CNIPlugins {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			return fmt.Errorf("nodes: CNI plugin %s not in %s: install containernetworking-plugins (hack/install-deps.sh)", p, cniBinDir)
		}
	}
	if _, err := os.Stat(filepath.Join(o.Assets, "kubelet")); err != nil {
		return fmt.Errorf("nodes: no kubelet in %q: run `make node-assets`", o.Assets)
	}
	found := false
	for _, im := range o.Images {
		found = found || im.Ref == o.SandboxImage
	}
	if o.SandboxImage == "" || !found {
		return fmt.Errorf("nodes: the sandbox image %q is not among the images to import", o.SandboxImage)
	}
	return nil
}

// prepare writes the node's directories, cgroups and configuration, puts the
// kubernetes Service address on its loopback and relays the API server into
// its namespace.
func (c *Cluster) prepare(ctx context.Context, n *Node) error {
	cp := c.opts.ControlPlane
	if err := n.layout.create(); err != nil {
		return err
	}
	if err := testbed.MakeCgroup(n.Cgroup); err != nil {
		return fmt.Errorf("cgroup %s: %w", n.Cgroup, err)
	}
	first, last := podRange(n.Bed)
	cni, err := cniConfig(n.Bed.PodCIDR, gatewayOf(n.Bed.PodCIDR), first, last)
	if err != nil {
		return err
	}
	kubelet, err := kubeletConfig(n.Cgroup, cp.KubeletClientCAFile())
	if err != nil {
		return err
	}
	files := map[string][]byte{
		n.layout.config("containerd.toml"): []byte(containerdConfig(n.layout, c.opts.SandboxImage, c.cniBinDir(n))),
		n.layout.config("kubelet.yaml"):    kubelet,
	}
	switch {
	case c.opts.Flannel != nil:
		fl, err := flannelFiles(n.layout, c.opts.Flannel)
		if err != nil {
			return err
		}
		maps.Copy(files, fl)
	case c.opts.Calico != nil:
		if err := calicoFiles(n.layout, c.opts.Calico); err != nil {
			return err
		}
	case c.opts.Cilium != nil:
		if err := ciliumFiles(n.layout, c.opts.Cilium); err != nil {
			return err
		}
	default:
		files[n.layout.private("/etc/cni/net.d/10-testbed.conflist")] = cni
	}
	if c.opts.Registry != "" {
		hosts := filepath.Join(n.layout.config("certs.d"), c.opts.Registry)
		if err := os.MkdirAll(hosts, 0o755); err != nil {
			return err
		}
		files[filepath.Join(hosts, "hosts.toml")] = []byte(registryHosts(c.opts.Registry))
	}
	if err := writeFiles(files); err != nil {
		return err
	}
	if err := cp.WriteNodeKubeconfig(n.layout.config("kubelet.kubeconfig"), n.Name); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "ip", "-n", n.Bed.NetNS, "addr", "replace", controlplane.ServiceIP+"/32", "dev", "lo").CombinedOutput(); err != nil {
		return fmt.Errorf("kubernetes Service address on lo: %w: %s", err, out)
	}
	if _, err := cp.RelayInto(n.Bed.NetNS); err != nil {
		return err
	}
	// The API server reaches the kubelet (logs, exec) and the node's pods
	// (webhooks) from inside the node.
	routes := []netip.Prefix{n.Bed.PodCIDR}
	for _, nic := range n.Bed.NICs {
		routes = append(routes, netip.PrefixFrom(nic.Addr.Addr(), 32))
	}
	cp.RouteToNode(n.Bed.NetNS, routes...)
	_, err = cp.RelayServiceInto(n.Bed.NetNS)
	return err
}

// podRange is the part of the node's pod CIDR host-local gives out: after
// the bed's pre-built pods (10.244.i.11 onwards), to .254.
func podRange(n *testbed.Node) (first, last netip.Addr) {
	base := n.PodCIDR.Addr().As4()
	used := 10
	for _, p := range n.Pods {
		if b := p.Addr.As4(); int(b[3]) > used {
			used = int(b[3])
		}
	}
	first = netip.AddrFrom4([4]byte{base[0], base[1], base[2], byte(used + 1)})
	last = netip.AddrFrom4([4]byte{base[0], base[1], base[2], 254})
	return first, last
}

// gatewayOf is the first address of a pod CIDR, which the bed's pods use as
// their gateway too.
func gatewayOf(cidr netip.Prefix) netip.Addr { return cidr.Masked().Addr().Next() }

// startContainerd starts the node's containerd in a new mount namespace set
// up by the layout's script, inside the node's network namespace, and waits
// until it answers on its socket.
func (c *Cluster) startContainerd(ctx context.Context, n *Node) error {
	args := []string{"containerd", "--config", n.layout.config("containerd.toml")}
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "slave", "--",
		"nsenter", "--net=/var/run/netns/" + n.Bed.NetNS, "--",
		"sh", "-c", n.layout.mountScript(), "node-mounts"}, args...)...)
	p, err := c.opts.Bed.StartCommand(n.Bed.NetNS, args, cmd)
	if err != nil {
		return err
	}
	n.Containerd = p
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := exec.CommandContext(ctx, "ctr", "--address", n.Socket(), "version").Run()
		if err == nil {
			break
		}
		select {
		case <-p.Done():
			return fmt.Errorf("containerd exited: %s", tailOf(p.ErrOutput()))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("containerd does not answer on %s: %s", n.Socket(), tailOf(p.ErrOutput()))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The chain unshare -> nsenter -> sh -> containerd execs, one PID: now
	// that containerd answers, its mount namespace is the node's.
	if n.mountNSRef, err = os.Open(n.MountNS()); err != nil {
		return err
	}
	ns, err := os.Readlink(n.MountNS())
	if err != nil {
		return err
	}
	n.mountNS = ns
	return nil
}

// importImages imports every image archive into the node's containerd, in
// the k8s.io namespace that its CRI plugin serves.
func (c *Cluster) importImages(ctx context.Context, n *Node) error {
	for _, im := range c.opts.Images {
		out, err := exec.CommandContext(ctx, "ctr", "--address", n.Socket(), "-n", "k8s.io", "images", "import", im.Archive).CombinedOutput()
		if err != nil {
			return fmt.Errorf("import %s: %w: %s", im.Archive, err, out)
		}
		if !strings.Contains(string(out), im.Ref) {
			return fmt.Errorf("import %s: the archive does not name %s: %s", im.Archive, im.Ref, out)
		}
	}
	return nil
}

// startKubelet starts the node's kubelet in the node's mount and network
// namespaces. It authenticates with a node client certificate and reaches
// the API server through the relay at the API server's own address.
func (c *Cluster) startKubelet(n *Node) error {
	labels := map[string]string{LabelMultipath: "true"}
	maps.Copy(labels, c.opts.Labels)
	args := []string{filepath.Join(c.opts.Assets, "kubelet"),
		"--config", n.layout.config("kubelet.yaml"),
		"--kubeconfig", n.layout.config("kubelet.kubeconfig"),
		"--hostname-override", n.Name,
		"--node-ip", n.Bed.NICs[0].Addr.Addr().String(),
		"--node-labels", labelFlag(labels),
		"--v=2",
	}
	cmd := exec.Command("nsenter", append([]string{"--mount=" + n.MountNS(), "--net=/var/run/netns/" + n.Bed.NetNS, "--"}, args...)...)
	p, err := c.opts.Bed.StartCommand(n.Bed.NetNS, args, cmd)
	if err != nil {
		return err
	}
	n.Kubelet = p
	return nil
}

// WaitReady waits until every Node is registered and Ready, and gives each
// its pod CIDR (assignPodCIDR).
func (c *Cluster) WaitReady(ctx context.Context) error {
	cl := c.opts.ControlPlane.Client
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, n := range c.Nodes {
		if err := c.assignPodCIDR(ctx, n); err != nil {
			return err
		}
		for {
			node := &corev1.Node{}
			err := cl.Get(ctx, client.ObjectKey{Name: n.Name}, node)
			if err == nil && nodeReady(node) {
				break
			}
			if err != nil {
				return fmt.Errorf("node %s: %w", n.Name, err)
			}
			select {
			case <-n.Kubelet.Done():
				return fmt.Errorf("kubelet of %s exited: %s", n.Name, tailOf(n.Kubelet.ErrOutput()))
			case <-ctx.Done():
				return fmt.Errorf("node %s not Ready: %w; kubelet log:\n%s", n.Name, ctx.Err(), tailOf(n.Kubelet.ErrOutput()))
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// assignPodCIDR waits until the kubelet has registered the Node and gives it
// its pod CIDR (spec.podCIDR(s), which the operator's controller and
// flanneld read) as the node IPAM controller would, but the bed's: the CIDR
// that the node's CNI configuration and the fabrics' routes use.
func (c *Cluster) assignPodCIDR(ctx context.Context, n *Node) error {
	cl := c.opts.ControlPlane.Client
	for {
		node := &corev1.Node{}
		err := cl.Get(ctx, client.ObjectKey{Name: n.Name}, node)
		if err == nil && node.Spec.PodCIDR != "" {
			return nil
		}
		if err == nil {
			orig := node.DeepCopy()
			node.Spec.PodCIDR, node.Spec.PodCIDRs = n.Bed.PodCIDR.String(), []string{n.Bed.PodCIDR.String()}
			err = cl.Patch(ctx, node, client.MergeFrom(orig))
		}
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		select {
		case <-n.Kubelet.Done():
			return fmt.Errorf("kubelet of %s exited: %s", n.Name, tailOf(n.Kubelet.ErrOutput()))
		case <-ctx.Done():
			return fmt.Errorf("node %s not registered: %w", n.Name, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Node returns the real node of bed node i (1-based).
func (c *Cluster) Node(i int) *Node { return c.Nodes[i-1] }

// Stop stops every node and removes what it made on the machine: the
// kubelet, the pods' processes (found in the node's cgroups), the processes
// left in the node's mount namespace (containerd and its shims), by PID;
// then the node's cgroups and state directory, and its Node object. The
// node's mount namespace, with every mount in it (pods' netns files, volumes,
// overlayfs), ends with its last process. The bed's namespaces are the bed's
// to delete (Bed.Down). Calling it twice is harmless.
func (c *Cluster) Stop() error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, c.stopNode(n))
	}
	if c.narrowCC != nil {
		errs = append(errs, c.narrowCC())
		c.narrowCC = nil
	}
	return errors.Join(errs...)
}

func (c *Cluster) stopNode(n *Node) error {
	var errs []error
	for _, p := range []*testbed.Process{n.Flanneld, n.Felix, n.CiliumAgent} {
		if p != nil {
			errs = append(errs, p.Stop(5*time.Second))
		}
	}
	if n.Kubelet != nil {
		errs = append(errs, n.Kubelet.Stop(5*time.Second))
	}
	testbed.StopPIDs(testbed.CgroupPIDs(n.Cgroup))
	if n.Containerd != nil {
		errs = append(errs, n.Containerd.Stop(5*time.Second))
	}
	if n.mountNSRef != nil {
		testbed.StopPIDs(PIDsInMountNS(n.mountNS))
		if left := PIDsInMountNS(n.mountNS); len(left) > 0 {
			errs = append(errs, fmt.Errorf("node %s: processes %v still in its mount namespace", n.Name, left))
		}
		// The namespace, and every mount in it, goes with this last reference.
		n.mountNSRef.Close()
		n.mountNSRef = nil
	}
	errs = append(errs, testbed.RemoveCgroup(n.Cgroup))
	if err := os.RemoveAll(n.Dir); err != nil {
		errs = append(errs, err)
	}
	if c.opts.ControlPlane.Env != nil {
		err := c.opts.ControlPlane.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PIDsInMountNS lists the processes whose mount namespace is ns ("mnt:[N]").
// Only meaningful while something holds that namespace: a freed namespace's
// number is given to the next one.
func PIDsInMountNS(ns string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "mnt")); err == nil && l == ns {
			pids = append(pids, pid)
		}
	}
	return pids
}

// tailOf is the end of a log, enough for an error message.
func tailOf(s string) string {
	const n = 3000
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
