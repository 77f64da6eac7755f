package framework

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
)

// NodeName is the Kubernetes name of a bed node: its namespace's name.
func NodeName(n *testbed.Node) string { return filepath.Base(n.NetNS) }

// RegisterBed creates a Node object per bed node (with its pod CIDR and
// labels) and a Pod per bed pod in namespace ns, bound to its node and
// reported Running with its address, as a kubelet would. It is deliberately
// small: no containers run, no readiness is computed.
func RegisterBed(ctx context.Context, c client.Client, b *testbed.Bed, ns string, nodeLabels map[string]string) error {
	for _, n := range b.Nodes {
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: NodeName(n), Labels: nodeLabels},
			Spec:       corev1.NodeSpec{PodCIDR: n.PodCIDR.String(), PodCIDRs: []string{n.PodCIDR.String()}},
		}
		if err := c.Create(ctx, node); err != nil {
			return fmt.Errorf("node %s: %w", node.Name, err)
		}
		for _, p := range n.Pods {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.Name, Labels: map[string]string{"app": "traffic"}},
				Spec: corev1.PodSpec{
					NodeName:   node.Name,
					Containers: []corev1.Container{{Name: "traffic", Image: "registry.invalid/traffic"}},
				},
			}
			if err := c.Create(ctx, pod); err != nil {
				return fmt.Errorf("pod %s: %w", p.Name, err)
			}
			ip := p.Addr.String()
			pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
			if err := c.Status().Update(ctx, pod); err != nil {
				return fmt.Errorf("pod %s status: %w", p.Name, err)
			}
		}
	}
	return nil
}

// StartKubeAgent starts the agent of node in kube mode against the API
// server of kubeconfig, which must be reachable from the node's namespace
// (ForwardAPIServer). A file with the node-local settings only (pin and state directories) is
// passed with -config. The agent's MPTCPNodeState must exist: StartKubeAgent
// waits for the first reconcile.
func StartKubeAgent(ctx context.Context, b *testbed.Bed, bin string, node *testbed.Node, kubeconfig string, opts ...AgentOption) (*Agent, error) {
	base := AgentConfig(b, node, mptcpv1alpha1.CompiledRule{})
	base.State = nil // the API has it
	a := &Agent{Node: node, Config: base, bin: bin, bed: b, ConfigPath: filepath.Join(b.Dir, fmt.Sprintf("agent-node%d.yaml", node.Index)),
		kubeArgs: []string{"-kubeconfig", kubeconfig, "-node", NodeName(node)}}
	for _, o := range opts {
		o(a)
	}
	if err := a.WriteConfig(base); err != nil {
		return nil, err
	}
	if err := a.Start(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// ForwardAPIServer makes the API server of kubeconfig reachable at the same
// address from inside every node namespace of the bed, whose loopback is not
// the host's, so the kubeconfig (and its certificate's 127.0.0.1) stays valid
// as it is (testbed.Relay). stop ends every relay.
func ForwardAPIServer(b *testbed.Bed, kubeconfig string) (stop func(), err error) {
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return nil, err
	}
	var relays []*testbed.Relay
	stop = func() {
		for _, r := range relays {
			r.Close()
		}
	}
	for _, n := range b.Nodes {
		for _, cl := range cfg.Clusters {
			u, err := url.Parse(cl.Server)
			if err != nil {
				stop()
				return nil, err
			}
			r, err := testbed.StartRelay(n.NetNS, u.Host)
			if err != nil {
				stop()
				return nil, fmt.Errorf("relaying %s into %s: %w", u.Host, n.NetNS, err)
			}
			relays = append(relays, r)
		}
	}
	return stop, nil
}

// WriteKubeconfig writes cfg's server, CA and bearer token as a kubeconfig at
// path: the agents run with their service account's bound token only, as
// kubelet would hand it to them.
func WriteKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["api"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["agent"] = &clientcmdapi.Context{Cluster: "api", AuthInfo: "agent"}
	kc.CurrentContext = "agent"
	return clientcmd.WriteToFile(*kc, path)
}
