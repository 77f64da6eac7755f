// Package controlplane runs the operator's control plane next to a test bed:
// a real etcd and kube-apiserver (from KUBEBUILDER_ASSETS) with the CRDs of
// config/crd and the agent's RBAC and admission policy of config/agent, the
// controller binary (cmd/controller) as a process, and one agent per bed node
// inside the node's namespace. The demo uses it; so can e2e tests. See
// docs/testbed.md, "Through the API".
package controlplane

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// Options configure Start.
type Options struct {
	// Assets is the directory holding kube-apiserver and etcd
	// (KUBEBUILDER_ASSETS; `make -s print-envtest-assets`).
	Assets string
	// Dir receives the kubeconfig and the controller's log.
	Dir string
	// Controller is the built cmd/controller binary (BuildController).
	// Required unless NoOperator is set.
	Controller string
	// Cluster runs the control plane as a cluster of real nodes needs it
	// (test/testbed/nodes): the API server with the Node authorizer,
	// NodeRestriction and ServiceAccount admission and a serving certificate
	// valid for the kubernetes Service address, plus kube-controller-manager
	// and kube-scheduler from Assets (`make node-assets`). See cluster.go.
	Cluster bool
	// NoOperator starts the cluster only: no CRDs, no mptcp-system
	// namespace, no config/agent resources, no controller process, for a
	// test that installs the operator itself (the Helm chart, whose crds/
	// helm applies: CRDs already there, from another source, would
	// conflict with them, as an earlier release's do).
	NoOperator bool
}

// ControlPlane is a running API server with the controller.
type ControlPlane struct {
	Env    *testenv.Env
	Client client.Client
	// Kubeconfig is the path of an admin kubeconfig (system:masters) the
	// controller and agents use.
	Kubeconfig string
	// ControllerLog is the controller's stderr.
	ControllerLog string

	controller *component
	// components are kube-controller-manager and kube-scheduler (Cluster).
	components []*component
	pki        *servingPKI
	egress     *egressProxy
	// kubeletClientCAs is the CA bundle kubelets trust (Cluster).
	kubeletClientCAs string
	relays           []*testbed.Relay
	apiRelays        map[string]*testbed.Relay // by namespace (RelayInto)
}

// Namespace of the operator's components (config/agent).
const Namespace = "mptcp-system"

// Start launches the API server (and, with Options.Cluster, the cluster's
// controllers and scheduler), applies config/agent and starts the controller
// unless NoOperator is set. On error everything started is stopped.
func Start(ctx context.Context, o Options) (cp *ControlPlane, err error) {
	cp = &ControlPlane{Kubeconfig: filepath.Join(o.Dir, "kubeconfig")}
	configure := func(e *envtest.Environment) error {
		if o.NoOperator {
			e.CRDDirectoryPaths, e.ErrorIfCRDPathMissing = nil, false
		}
		if o.Cluster {
			return cp.configureCluster(o.Dir)(e)
		}
		return nil
	}
	env, err := testenv.LaunchWith(o.Assets, configure)
	if err != nil {
		cp.egress.close()
		return nil, err
	}
	cp.Env, cp.Client = env, env.Client
	defer func() {
		if err != nil {
			err = errors.Join(err, cp.Stop())
			cp = nil
		}
	}()
	if err := env.WriteKubeconfig(cp.Kubeconfig, "mptcp-demo"); err != nil {
		return cp, err
	}
	if o.Cluster {
		if err := cp.allowKubeletAccess(ctx, o.Dir); err != nil {
			return cp, err
		}
		if err := cp.startClusterComponents(o); err != nil {
			return cp, err
		}
	}
	if o.NoOperator {
		return cp, nil
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}
	if err := cp.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return cp, err
	}
	if err := cp.ApplyKustomization(ctx, filepath.Join(testenv.RepoRoot(), "config", "agent")); err != nil {
		return cp, err
	}
	if err := cp.startController(o); err != nil {
		return cp, err
	}
	return cp, nil
}

// startController runs cmd/controller with the kubeconfig; its metrics and
// probes are off so that several control planes on one machine do not fight
// over ports.
func (cp *ControlPlane) startController(o Options) error {
	if o.Controller == "" {
		return errors.New("controlplane: no controller binary")
	}
	c, err := startComponent(o.Dir, "controller", o.Controller, "--kubeconfig", cp.Kubeconfig,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0")
	if err != nil {
		return err
	}
	cp.controller, cp.ControllerLog = c, c.log
	return nil
}

// ControllerExited is closed if the controller process ends; it is never
// closed when no controller was started.
func (cp *ControlPlane) ControllerExited() <-chan struct{} {
	if cp.controller == nil {
		return nil
	}
	return cp.controller.exited
}

// Stop stops the relays, the controller, kube-scheduler and
// kube-controller-manager (SIGTERM, then SIGKILL, by their PIDs) and the API
// server.
func (cp *ControlPlane) Stop() error {
	var errs []error
	for _, r := range cp.relays {
		r.Close()
	}
	cp.relays, cp.apiRelays = nil, nil
	cp.controller.stop(5 * time.Second)
	cp.controller = nil
	for i := len(cp.components) - 1; i >= 0; i-- {
		cp.components[i].stop(5 * time.Second)
	}
	cp.components = nil
	// The egress proxy before the API server: a stream the API server
	// proxies to a kubelet that is gone (logs, exec) would otherwise hold
	// its drain of requests in flight when it is told to stop.
	cp.egress.close()
	cp.egress = nil
	if cp.Env != nil {
		errs = append(errs, cp.Env.Stop())
		cp.Env = nil
	}
	return errors.Join(errs...)
}
