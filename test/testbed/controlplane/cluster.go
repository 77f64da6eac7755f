package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// A cluster with real nodes (Options.Cluster, test/testbed/nodes) needs more
// of the control plane than the operator's own tests: kubelets that
// authenticate as nodes, pods that get service-account tokens and reach the
// API server from their own namespaces, and the controllers that turn
// Deployments and DaemonSets into pods. See docs/testbed.md, "Real nodes".

// ServiceIP and ServicePort are the address of the kubernetes Service in
// namespace default: the first address of the API server's service range
// (envtest's 10.0.0.0/24) and port 443. Kubelets put them into every
// container as KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, which
// in-cluster clients use. There is no kube-proxy: RelayServiceInto serves the
// address on a node, as kube-proxy's old userspace mode did.
const (
	ServiceIP   = "10.0.0.1"
	ServicePort = 443
)

// clusterControllers are the kube-controller-manager controllers the tests
// need: a ServiceAccount and the kube-root-ca.crt ConfigMap in every
// namespace (pods cannot start without them once the ServiceAccount admission
// plugin is on), Deployments, ReplicaSets and DaemonSets into Pods,
// PodDisruptionBudget status, garbage collection of owned objects and of
// deleted namespaces (what `helm uninstall` relies on), and the node
// lifecycle controller, which lifts the not-ready taint from Ready nodes and
// taints nodes whose kubelet stopped.
var clusterControllers = []string{
	"serviceaccount-controller",
	"root-ca-certificate-publisher-controller",
	"deployment-controller",
	"replicaset-controller",
	"daemonset-controller",
	"disruption-controller",
	"garbage-collector-controller",
	"namespace-controller",
	"node-lifecycle-controller",
	"taint-eviction-controller",
	"endpointslice-controller",
}

// configureCluster sets the API server up for real nodes before it starts:
// its own serving certificate that also names ServiceIP, the Node authorizer
// and the NodeRestriction admission plugin (kubelets may only touch their own
// Node and the pods bound to it), the ServiceAccount admission plugin back on
// (envtest turns it off), so that pods get a projected service-account
// token, a client certificate toward kubelets, and its "cluster" egress (to
// kubelets, pods) through cp's egress proxy, which dials from inside the bed
// (egress.go). Webhooks and aggregated APIs are dialed at their endpoints'
// addresses (aggregator routing): there is no kube-proxy to turn a Service's
// address into them.
func (cp *ControlPlane) configureCluster(dir string) func(*envtest.Environment) error {
	return func(e *envtest.Environment) error {
		p, err := writeServingPKI(filepath.Join(dir, "apiserver"), []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(ServiceIP)})
		if err != nil {
			return err
		}
		cp.pki = p
		if cp.egress, err = startEgressProxy(); err != nil {
			return err
		}
		egressConfig, err := cp.egress.writeConfig(filepath.Dir(p.CertFile))
		if err != nil {
			return err
		}
		// Told to stop, the API server drains the requests in flight for up
		// to its 60 s request timeout; envtest's 20 s would kill it and fail
		// a test whose checks all passed.
		e.ControlPlaneStopTimeout = 65 * time.Second
		api := e.ControlPlane.GetAPIServer()
		// envtest keeps a serving certificate it finds in its directory, and
		// then trusts the CA it is told.
		api.CertDir = filepath.Dir(p.CertFile)
		api.CA = p.CA
		api.Configure().
			Set("authorization-mode", "Node,RBAC").
			Set("enable-admission-plugins", "NodeRestriction").
			Disable("disable-admission-plugins").
			Set("service-account-key-file", p.SAPubFile).
			Set("service-account-signing-key-file", p.SAKeyFile).
			Set("kubelet-client-certificate", p.KubeletClientCertFile).
			Set("kubelet-client-key", p.KubeletClientKeyFile).
			Set("kubelet-preferred-address-types", "InternalIP").
			Set("egress-selector-config-file", egressConfig).
			Set("enable-aggregator-routing", "true")
		return nil
	}
}

// allowKubeletAccess lets the API server's kubelet client use kubelets' API
// (logs, exec, port-forward), as kubeadm binds it, and writes the CA bundle
// kubelets authenticate clients with: the API server's client CA (users of
// WriteUserKubeconfig) and the kubelet-client CA.
func (cp *ControlPlane) allowKubeletAccess(ctx context.Context, dir string) error {
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-apiserver-kubelet-api-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: KubeletClientUser}},
	}
	if err := cp.Client.Create(ctx, binding); err != nil {
		return err
	}
	clientCA, err := os.ReadFile(cp.Env.ClientCAFile())
	if err != nil {
		return fmt.Errorf("the API server's client CA: %w", err)
	}
	cp.kubeletClientCAs = filepath.Join(dir, "apiserver", "kubelet-client-cas.crt")
	return os.WriteFile(cp.kubeletClientCAs, append(append(clientCA, '\n'), cp.pki.KubeletClientCA...), 0o600)
}

// KubeletClientCAFile is the CA bundle a kubelet trusts client certificates
// of (its configuration's authentication.x509.clientCAFile): the API
// server's own client certificate toward kubelets, and every user of
// WriteUserKubeconfig. Cluster mode only.
func (cp *ControlPlane) KubeletClientCAFile() string { return cp.kubeletClientCAs }

// RouteToNode has the API server reach prefixes (a node's addresses, its pod
// CIDR) from inside network namespace ns (a name under /var/run/netns), for
// kubectl logs, exec and port-forward and for pods serving webhooks.
// Cluster mode only.
func (cp *ControlPlane) RouteToNode(ns string, prefixes ...netip.Prefix) {
	if cp.egress != nil {
		cp.egress.addRoute(ns, prefixes...)
	}
}

// startClusterComponents runs kube-controller-manager and kube-scheduler from
// the assets directory, each with a client certificate of the user the
// default RBAC roles are written for. Each controller of
// kube-controller-manager acts with its own service account, as kubeadm
// sets it up. Neither serves HTTPS (secure port 0): several control planes
// share the machine's namespace.
func (cp *ControlPlane) startClusterComponents(o Options) error {
	for _, bin := range []string{"kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(o.Assets, bin)); err != nil {
			return fmt.Errorf("%s is not in %s: run `make node-assets`: %w", bin, o.Assets, err)
		}
	}
	kcmConfig := filepath.Join(o.Dir, "kube-controller-manager.kubeconfig")
	if err := cp.Env.WriteUserKubeconfig(kcmConfig, "system:kube-controller-manager"); err != nil {
		return err
	}
	schedConfig := filepath.Join(o.Dir, "kube-scheduler.kubeconfig")
	if err := cp.Env.WriteUserKubeconfig(schedConfig, "system:kube-scheduler"); err != nil {
		return err
	}
	kcm, err := startComponent(o.Dir, "kube-controller-manager", filepath.Join(o.Assets, "kube-controller-manager"),
		"--kubeconfig", kcmConfig,
		"--controllers", strings.Join(clusterControllers, ","),
		"--use-service-account-credentials",
		"--root-ca-file", cp.pki.CAFile,
		"--leader-elect=false",
		"--secure-port=0",
		"--v=2",
	)
	if err != nil {
		return err
	}
	cp.components = append(cp.components, kcm)
	sched, err := startComponent(o.Dir, "kube-scheduler", filepath.Join(o.Assets, "kube-scheduler"),
		"--kubeconfig", schedConfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--v=2",
	)
	if err != nil {
		return err
	}
	cp.components = append(cp.components, sched)
	// A bad flag ends a component at once; catch that here, with its log.
	time.Sleep(500 * time.Millisecond)
	return errors.Join(kcm.running(), sched.running())
}

// ComponentsRunning fails if kube-controller-manager or kube-scheduler has
// exited, with the end of its log.
func (cp *ControlPlane) ComponentsRunning() error {
	var errs []error
	for _, c := range cp.components {
		errs = append(errs, c.running())
	}
	return errors.Join(errs...)
}

// WriteNodeKubeconfig writes the kubeconfig a kubelet of node name uses: a
// client certificate for system:node:<name> in group system:nodes, signed by
// the API server's client CA, as kubeadm writes kubelet.conf. The server is
// the API server's own address, which a relay serves in the node's namespace
// (RelayInto).
func (cp *ControlPlane) WriteNodeKubeconfig(path, name string) error {
	if cp.pki == nil {
		return errors.New("controlplane: not started with Options.Cluster")
	}
	return cp.Env.WriteUserKubeconfig(path, "system:node:"+name, "system:nodes")
}

// ServingCA is the PEM CA that signed the API server's serving certificate
// (in Cluster mode), which kube-root-ca.crt publishes.
func (cp *ControlPlane) ServingCA() []byte {
	if cp.pki == nil {
		return nil
	}
	return cp.pki.CA
}

// RelayServiceInto serves the kubernetes Service address (ServiceIP,
// ServicePort) inside network namespace ns, relayed to the API server: pods
// of a node reach it through their default route to the node, and
// hostNetwork pods directly. ServiceIP must be an address in ns (the node
// package puts it on the node's loopback).
func (cp *ControlPlane) RelayServiceInto(ns string) (*testbed.Relay, error) {
	u, err := url.Parse(cp.Env.Config.Host)
	if err != nil {
		return nil, fmt.Errorf("API server address: %w", err)
	}
	r, err := testbed.StartRelayTo(ns, net.JoinHostPort(ServiceIP, strconv.Itoa(ServicePort)), u.Host)
	if err != nil {
		return nil, err
	}
	cp.relays = append(cp.relays, r)
	return r, nil
}
