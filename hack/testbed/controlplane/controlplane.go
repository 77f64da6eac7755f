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
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/testenv"
)

// Options configure Start.
type Options struct {
	// Assets is the directory holding kube-apiserver and etcd
	// (KUBEBUILDER_ASSETS; `make -s print-envtest-assets`).
	Assets string
	// Dir receives the kubeconfig and the controller's log.
	Dir string
	// Controller is the built cmd/controller binary (BuildBinaries).
	Controller string
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

	controller *exec.Cmd
	exited     chan struct{}
	relays     []*testbed.Relay
}

// Namespace of the operator's components (config/agent).
const Namespace = "mptcp-system"

// Start launches the API server, applies config/agent and starts the
// controller. On error everything started is stopped.
func Start(ctx context.Context, o Options) (cp *ControlPlane, err error) {
	env, err := testenv.Launch(o.Assets)
	if err != nil {
		return nil, err
	}
	cp = &ControlPlane{Env: env, Client: env.Client, Kubeconfig: filepath.Join(o.Dir, "kubeconfig")}
	defer func() {
		if err != nil {
			err = errors.Join(err, cp.Stop())
			cp = nil
		}
	}()
	if err := env.WriteKubeconfig(cp.Kubeconfig, "mptcp-demo"); err != nil {
		return cp, err
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
	cp.ControllerLog = filepath.Join(o.Dir, "controller.log")
	log, err := os.Create(cp.ControllerLog)
	if err != nil {
		return err
	}
	cmd := exec.Command(o.Controller, "--kubeconfig", cp.Kubeconfig,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start controller: %w", err)
	}
	cp.controller, cp.exited = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(cp.exited)
	}()
	return nil
}

// ControllerExited is closed if the controller process ends.
func (cp *ControlPlane) ControllerExited() <-chan struct{} { return cp.exited }

// Stop stops the relays, the controller (SIGTERM, then SIGKILL, by its PID)
// and the API server.
func (cp *ControlPlane) Stop() error {
	var errs []error
	for _, r := range cp.relays {
		r.Close()
	}
	cp.relays = nil
	if cp.controller != nil {
		_ = cp.controller.Process.Signal(syscall.SIGTERM)
		select {
		case <-cp.exited:
		case <-time.After(5 * time.Second):
			_ = cp.controller.Process.Kill()
			<-cp.exited
		}
		cp.controller = nil
	}
	if cp.Env != nil {
		errs = append(errs, cp.Env.Stop())
		cp.Env = nil
	}
	return errors.Join(errs...)
}

// BuildController builds cmd/controller into dir.
func BuildController(dir string) (string, error) {
	bin := filepath.Join(dir, "controller")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/mptcp-operator/mptcp-operator/cmd/controller").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building cmd/controller: %w\n%s", err, out)
	}
	return bin, nil
}
