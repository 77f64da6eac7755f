package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/controlplane"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/release"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// ScenarioAPI is the agent scenario as a cluster runs it: the operator
// installed with its Helm chart, policies applied to the API server, the
// controller compiling them, agents reading their node's state, workloads
// started by real kubelets from Pod specs.
const ScenarioAPI = "MPTCP, agent via the API"

const (
	demoNamespace = "demo"
	apiPort       = 5204
)

// apiRun is the control plane, real nodes and release of the scenario.
type apiRun struct {
	bed    *testbed.Bed
	cp     *controlplane.ControlPlane
	nodes  *nodes.Cluster
	images nodes.Images
	helm   release.Helm
	// installed: the release exists, Close uninstalls it.
	installed bool
	logs      string
	log       func(format string, args ...any)
}

// startAPI brings up the control plane (API server, kube-controller-manager,
// kube-scheduler), a kubelet and a containerd on every bed node with the
// images of imagesDir (make images), installs the chart with helm as an
// admin would, and applies examples/. Close stops everything.
func startAPI(ctx context.Context, bed *testbed.Bed, helm, assets, imagesDir, logs string, log func(string, ...any)) (r *apiRun, err error) {
	// Only this run's logs: bed prefixes differ between runs.
	if err := os.RemoveAll(logs); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}
	images, err := nodes.ReadImages(imagesDir)
	if err != nil {
		return nil, err
	}
	r = &apiRun{bed: bed, images: images, logs: logs, log: log}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.Close())
		}
	}()
	log("starting the control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler ...")
	cplog, err := os.Create(filepath.Join(logs, "control-plane.log"))
	if err != nil {
		return r, err
	}
	// controller-runtime's own logs (the control plane's clients) go there:
	// set before the first of them logs, as controller-runtime takes only
	// its first logger.
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(cplog, nil)))
	if r.cp, err = controlplane.Start(ctx, controlplane.Options{Assets: assets, Dir: logs, Cluster: true, NoOperator: true}); err != nil {
		return r, err
	}
	log("starting a containerd and a kubelet on every node ...")
	r.nodes, err = nodes.Start(ctx, nodes.Options{Bed: bed, ControlPlane: r.cp, Assets: assets, Images: images.All(), SandboxImage: images[nodes.PauseImage].Ref})
	if err != nil {
		return r, err
	}
	values, err := release.ImageValues(images)
	if err != nil {
		return r, err
	}
	r.helm = release.Helm{Binary: helm, Kubeconfig: r.cp.Kubeconfig}
	log("helm install %s charts/mptcp-operator -n %s --create-namespace (images imported on the nodes: pullPolicy Never) ...", release.Name, release.Namespace)
	if _, err := r.helm.Install(ctx, release.Chart(), values...); err != nil {
		return r, err
	}
	r.installed = true
	examples, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "examples", "*.yaml"))
	log("applying %s ...", strings.Join(relative(examples), ", "))
	if err := r.cp.ApplyFiles(ctx, examples...); err != nil {
		return r, err
	}
	// examples/policy-spread.yaml selects pods in namespaces labelled so.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace, Labels: map[string]string{"mptcp.io/tenant": "enabled"}}}
	if err := r.cp.Client.Create(ctx, ns); err != nil {
		return r, err
	}
	return r, nodes.AllowAwait(ctx, r.cp.Client, demoNamespace)
}

// nodeName is the Node name of a bed node: its namespace's name.
func nodeName(n *testbed.Node) string { return n.NetNS }

func relative(paths []string) []string {
	var out []string
	for _, p := range paths {
		if rel, err := filepath.Rel(testenv.RepoRoot(), p); err == nil {
			p = rel
		}
		out = append(out, p)
	}
	return out
}

// Close keeps the chart's pods' logs, uninstalls the release (the agents
// take their programs, pins, rules and settings away as their DaemonSet
// goes), then stops the nodes and the control plane, and keeps their logs.
func (r *apiRun) Close() error {
	var errs []error
	if r.installed {
		errs = append(errs, r.keepPodLogs(release.Namespace))
		r.log("helm uninstall %s -n %s ...", release.Name, release.Namespace)
		if _, err := r.helm.Uninstall(context.Background()); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, r.waitChartPodsGone())
	}
	if r.nodes != nil {
		for _, n := range r.nodes.Nodes {
			for name, p := range map[string]*testbed.Process{"kubelet": n.Kubelet, "containerd": n.Containerd} {
				if p != nil {
					errs = append(errs, os.WriteFile(filepath.Join(r.logs, name+"-"+n.Name+".log"), []byte(p.ErrOutput()), 0o644))
				}
			}
		}
		errs = append(errs, r.nodes.Stop())
	}
	if r.cp != nil {
		errs = append(errs, r.cp.Stop())
	}
	return errors.Join(errs...)
}

// keepPodLogs writes the logs of namespace's pods' containers to the logs
// directory: <pod>-<container>.log.
func (r *apiRun) keepPodLogs(namespace string) error {
	var pods corev1.PodList
	if err := r.cp.Client.List(context.Background(), &pods, client.InNamespace(namespace)); err != nil {
		return err
	}
	var errs []error
	for i := range pods.Items {
		p := &pods.Items[i]
		n := r.nodes.NodeOf(p)
		if n == nil {
			continue
		}
		for _, c := range p.Spec.Containers {
			out, _ := n.ContainerLog(p, c.Name, "")
			errs = append(errs, os.WriteFile(filepath.Join(r.logs, p.Name+"-"+c.Name+".log"), []byte(out), 0o644))
		}
	}
	return errors.Join(errs...)
}

// waitChartPodsGone waits until the release's pods have stopped: helm's
// --wait covers the objects it deletes, not the pods deleted after them.
func (r *apiRun) waitChartPodsGone() error {
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		var pods corev1.PodList
		if err := r.cp.Client.List(context.Background(), &pods, client.InNamespace(release.Namespace)); err != nil {
			return err
		}
		if len(pods.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d pods of the release still exist a minute after helm uninstall", len(pods.Items))
		}
	}
}

// pod is a demo Pod on a named node: the traffic tool from its image, held
// by an init container until the agent has configured the pod.
func (r *apiRun) pod(name string, node *testbed.Node, env []corev1.EnvVar, args ...string) *corev1.Pod {
	return nodes.TrafficPod(demoNamespace, name, nodeName(node), r.images[nodes.TrafficImage].Ref, map[string]string{"app": name}, env, args...)
}

// transfer runs the scenario's transfer: a server Pod on node 2 and a
// client Pod on node 1, both run by their nodes' kubelets from the traffic
// image, and measures it as framework.Transfer measures the other
// scenarios.
func (r *apiRun) transfer(ctx context.Context, duration, warmup time.Duration, conns int) (framework.Measurement, error) {
	m := framework.Measurement{Scenario: ScenarioAPI}
	window := duration - warmup - time.Second
	server := r.pod("server", r.bed.Node(2), []corev1.EnvVar{nodes.PodIPEnv},
		"serve", "-listen", fmt.Sprintf("$(POD_IP):%d", apiPort), "-mptcp",
		"-warmup", warmup.String(), "-window", window.String())
	if err := r.cp.Client.Create(ctx, server); err != nil {
		return m, err
	}
	if err := nodes.WaitStarted(ctx, r.cp.Client, server, 60*time.Second); err != nil {
		return m, err
	}
	if err := r.nodes.WaitListening(ctx, server, 30*time.Second); err != nil {
		return m, err
	}
	r.log("server pod runs the traffic image on %s (%s)", server.Spec.NodeName, server.Status.PodIP)

	cli := r.pod("client", r.bed.Node(1), []corev1.EnvVar{{Name: "SERVER", Value: fmt.Sprintf("%s:%d", server.Status.PodIP, apiPort)}},
		"send", "-to", "$(SERVER)", "-mptcp", "-json", "-conns", fmt.Sprint(conns), "-duration", duration.String())
	if err := r.cp.Client.Create(ctx, cli); err != nil {
		return m, err
	}
	node := r.bed.Node(1)
	if err := nodes.WaitStarted(ctx, r.cp.Client, cli, 60*time.Second); err != nil {
		return m, err
	}
	m.Start = time.Now()
	type result struct {
		a, b []uint64
		err  error
	}
	resc := make(chan result, 1)
	go func() {
		var res result
		time.Sleep(warmup)
		if res.a, res.err = txCounters(r.bed, node); res.err == nil {
			time.Sleep(window)
			res.b, res.err = txCounters(r.bed, node)
		}
		resc <- res
	}()
	if err := r.nodes.WaitEnded(ctx, r.cp.Client, cli); err != nil {
		return m, fmt.Errorf("client pod: %w", err)
	}
	m.End = time.Now()
	sent, err := r.nodes.SenderReports(cli)
	if err != nil {
		return m, err
	}
	got, err := r.nodes.ServerReports(ctx, server, len(sent), 30*time.Second)
	if err != nil {
		return m, err
	}
	byRemote, err := testbed.MatchReports(sent, got)
	if err != nil {
		return m, err
	}
	for _, s := range sent {
		m.GoodputBps += byRemote[s.Local].GoodputBps
	}
	res := <-resc
	if res.err != nil {
		return m, res.err
	}
	for i := range res.a {
		m.NICMbps = append(m.NICMbps, float64(res.b[i]-res.a[i])*8/window.Seconds()/1e6)
	}
	return m, nil
}

func txCounters(bed *testbed.Bed, node *testbed.Node) ([]uint64, error) {
	tx := make([]uint64, len(node.NICs))
	for _, nic := range node.NICs {
		_, t, err := bed.NICCounters(node, nic.Index)
		if err != nil {
			return nil, err
		}
		tx[nic.Index-1] = t
	}
	return tx, nil
}

// describeNodeStates prints what the controller compiled for each node: the
// paths (and their NICs) and the pods it governs.
func (r *apiRun) describeNodeStates(ctx context.Context) {
	for _, n := range r.bed.Nodes {
		var st mptcpv1alpha1.MPTCPNodeState
		if err := r.cp.Client.Get(ctx, client.ObjectKey{Name: nodeName(n)}, &st); err != nil {
			r.log("node state of %s: %v", nodeName(n), err)
			continue
		}
		var paths, pods []string
		for _, p := range st.Spec.Paths {
			paths = append(paths, p.Name+"="+p.Interface.Name)
		}
		for _, p := range st.Spec.Pods {
			pods = append(pods, p.Namespace+"/"+p.Name)
		}
		r.log("MPTCPNodeState %s: paths %v, pods %v", st.Name, paths, pods)
	}
}
