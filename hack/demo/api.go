package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/e2e/framework"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed/controlplane"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/testenv"
)

// ScenarioAPI is the agent scenario as a cluster runs it: policies applied
// to the API server, the controller compiling them, agents reading their
// node's state, workloads started by real kubelets from Pod specs.
const ScenarioAPI = "MPTCP, agent via the API"

const (
	demoNamespace = "demo"
	// readyGate is the condition the agent sets on a pod once its MPTCP is
	// configured; each demo pod's init container waits for it.
	readyGate = "mptcp.io/ready"
	apiPort   = 5204
)

// apiRun is the control plane, real nodes and agents of the scenario.
type apiRun struct {
	bed    *testbed.Bed
	cp     *controlplane.ControlPlane
	nodes  *nodes.Cluster
	images nodes.Images
	agents []*controlplane.Agent
	logs   string
	log    func(format string, args ...any)
}

// startAPI brings up the control plane (API server, kube-controller-manager,
// kube-scheduler, config/agent, the controller binary), a kubelet and a
// containerd on every bed node with the images of imagesDir (make images),
// and applies examples/. Close stops everything.
func startAPI(ctx context.Context, bed *testbed.Bed, bins framework.Binaries, assets, imagesDir, logs string, log func(string, ...any)) (r *apiRun, err error) {
	// Only this run's logs: bed prefixes differ between runs.
	if err := os.RemoveAll(logs); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}
	controller, err := controlplane.BuildController(filepath.Dir(bins.Agent))
	if err != nil {
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
	log("starting the control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, CRDs, config/agent, the controller ...")
	cplog, err := os.Create(filepath.Join(logs, "control-plane.log"))
	if err != nil {
		return r, err
	}
	// controller-runtime's own logs (the control plane's clients) go there:
	// set before the first of them logs, as controller-runtime takes only
	// its first logger.
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(cplog, nil)))
	if r.cp, err = controlplane.Start(ctx, controlplane.Options{Assets: assets, Dir: logs, Controller: controller, Cluster: true}); err != nil {
		return r, err
	}
	log("starting a containerd and a kubelet on every node ...")
	r.nodes, err = nodes.Start(ctx, nodes.Options{Bed: bed, ControlPlane: r.cp, Assets: assets, Images: images.All(), SandboxImage: images[nodes.PauseImage].Ref})
	if err != nil {
		return r, err
	}
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
	return r, r.allowAwait(ctx)
}

// allowAwait lets the demo namespace's pods read themselves, which their
// init container (traffic await) does to wait for the agent's gate.
func (r *apiRun) allowAwait(ctx context.Context) error {
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "read-own-pod", Namespace: demoNamespace},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "read-own-pod", Namespace: demoNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "default", Namespace: demoNamespace}},
	}
	if err := r.cp.Client.Create(ctx, role); err != nil {
		return err
	}
	return r.cp.Client.Create(ctx, binding)
}

// nodeName is the Node name of a bed node: its namespace's name.
func nodeName(n *testbed.Node) string { return n.NetNS }

// startAgents starts one agent per node in kube mode, as processes in the
// nodes' namespaces; ErrNoKubeMode when the agent binary has none.
func (r *apiRun) startAgents(ctx context.Context, bin string) error {
	if err := controlplane.AgentKubeMode(bin); err != nil {
		return err
	}
	r.log("starting one agent per node (kube mode) ...")
	// The API gives paths, rules and pods; a file gives each agent the
	// node-local settings: pins and state inside the bed, so that Down
	// removes them.
	configs := map[*testbed.Node]string{}
	for _, n := range r.bed.Nodes {
		cfg := framework.AgentConfig(r.bed, n, mptcpv1alpha1.CompiledRule{})
		cfg.Node = nodeName(n)
		raw, err := yaml.Marshal(cfg.Settings)
		if err != nil {
			return err
		}
		configs[n] = filepath.Join(r.logs, "agent-"+cfg.Node+".yaml")
		if err := os.WriteFile(configs[n], raw, 0o600); err != nil {
			return err
		}
	}
	var err error
	r.agents, err = r.cp.StartAgents(ctx, r.bed, bin, nodeName, func(n *testbed.Node) []string {
		return []string{"-config", configs[n]}
	})
	return err
}

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

// Close stops the agents, the nodes (their pods with them), the controller
// and the control plane, in that order, and keeps their logs.
func (r *apiRun) Close() error {
	var errs []error
	errs = append(errs, controlplane.StopAgents(r.agents))
	// The bed's directory goes with the bed: keep the agents' and nodes' logs.
	for _, a := range r.agents {
		errs = append(errs, os.WriteFile(filepath.Join(r.logs, "agent-"+a.Name+".log"), []byte(a.Proc.ErrOutput()), 0o644))
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

// pod is a demo Pod on a named node: the traffic tool from its image, held
// by an init container until the agent has configured the pod (its
// readiness gate True), as the kubelet starts containers at once and a gate
// alone would only keep the pod out of Ready.
func (r *apiRun) pod(name string, node *testbed.Node, env []corev1.EnvVar, args ...string) *corev1.Pod {
	field := func(env, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: env, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: demoNamespace, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:       nodeName(node),
			RestartPolicy:  corev1.RestartPolicyNever,
			ReadinessGates: []corev1.PodReadinessGate{{ConditionType: readyGate}},
			InitContainers: []corev1.Container{{
				Name: "await-agent", Image: r.images[nodes.TrafficImage].Ref, ImagePullPolicy: corev1.PullNever,
				Args: []string{"await", "-condition", readyGate},
				Env:  []corev1.EnvVar{field("POD_NAME", "metadata.name"), field("POD_NAMESPACE", "metadata.namespace")},
			}},
			Containers: []corev1.Container{{
				Name: "traffic", Image: r.images[nodes.TrafficImage].Ref, ImagePullPolicy: corev1.PullNever,
				Args: args, Env: env,
			}},
		},
	}
}

// waitStarted waits until the pod's workload container runs (or has already
// ended), which needs the agent to have set the readiness gate.
func (r *apiRun) waitStarted(ctx context.Context, name string, timeout time.Duration) (*corev1.Pod, error) {
	key := types.NamespacedName{Namespace: demoNamespace, Name: name}
	deadline := time.Now().Add(timeout)
	for {
		pod := &corev1.Pod{}
		if err := r.cp.Client.Get(ctx, key, pod); err != nil {
			return nil, err
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Name == "traffic" && (cs.State.Running != nil || cs.State.Terminated != nil) {
				return pod, nil
			}
		}
		if time.Now().After(deadline) || pod.Status.Phase == corev1.PodFailed {
			return nil, fmt.Errorf("pod %s not started after %v: phase %q, IP %q, conditions %s (the agent sets %s once it configured the pod; agent logs under %s)",
				key, timeout, pod.Status.Phase, pod.Status.PodIP, conditions(pod), readyGate, r.bed.Dir)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitEnded waits until the pod has run to its end: nil when it succeeded.
func (r *apiRun) waitEnded(ctx context.Context, pod *corev1.Pod) error {
	for {
		if err := r.cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		switch pod.Status.Phase {
		case corev1.PodSucceeded:
			return nil
		case corev1.PodFailed:
			log, _ := r.nodes.NodeOf(pod).ContainerLog(pod, "traffic", "")
			return fmt.Errorf("pod %s failed: %s", pod.Name, log)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logOf is what a container of the pod wrote to stream so far.
func (r *apiRun) logOf(pod *corev1.Pod, stream string) string {
	out, _ := r.nodes.NodeOf(pod).ContainerLog(pod, "traffic", stream)
	return out
}

func conditions(p *corev1.Pod) string {
	var s []string
	for _, c := range p.Status.Conditions {
		s = append(s, fmt.Sprintf("%s=%s", c.Type, c.Status))
	}
	return "[" + strings.Join(s, " ") + "]"
}

// transfer runs the scenario's transfer: a server Pod on node 2 and a
// client Pod on node 1, both run by their nodes' kubelets from the traffic
// image, and measures it as framework.Transfer measures the other
// scenarios.
func (r *apiRun) transfer(ctx context.Context, duration, warmup time.Duration, conns int) (framework.Measurement, error) {
	m := framework.Measurement{Scenario: ScenarioAPI}
	window := duration - warmup - time.Second
	server, err := r.createServer(ctx, warmup, window)
	if err != nil {
		return m, err
	}
	if server, err = r.waitStarted(ctx, server.Name, 60*time.Second); err != nil {
		return m, err
	}
	for !strings.Contains(r.logOf(server, "stderr"), "listening on") {
		select {
		case <-ctx.Done():
			return m, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	r.log("server pod runs the traffic image on %s (%s)", server.Spec.NodeName, server.Status.PodIP)

	cli := r.pod("client", r.bed.Node(1), []corev1.EnvVar{{Name: "SERVER", Value: fmt.Sprintf("%s:%d", server.Status.PodIP, apiPort)}},
		"send", "-to", "$(SERVER)", "-mptcp", "-json", "-conns", fmt.Sprint(conns), "-duration", duration.String())
	if err := r.cp.Client.Create(ctx, cli); err != nil {
		return m, err
	}
	node := r.bed.Node(1)
	if cli, err = r.waitStarted(ctx, "client", 60*time.Second); err != nil {
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
	if err := r.waitEnded(ctx, cli); err != nil {
		return m, fmt.Errorf("client pod: %w", err)
	}
	m.End = time.Now()
	sent, err := senderReports(r.logOf(cli, "stdout"))
	if err != nil {
		return m, err
	}
	got, err := r.serverReports(ctx, server, len(sent))
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

// serverReports waits until the server pod has reported n connections on its
// stdout.
func (r *apiRun) serverReports(ctx context.Context, server *corev1.Pod, n int) ([]testbed.ServerReport, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var got []testbed.ServerReport
		sc := bufio.NewScanner(strings.NewReader(r.logOf(server, "stdout")))
		for sc.Scan() {
			var rep testbed.ServerReport
			if err := json.Unmarshal(sc.Bytes(), &rep); err == nil {
				got = append(got, rep)
			}
		}
		if len(got) >= n {
			return got, nil
		}
		select {
		case <-ctx.Done():
			return got, fmt.Errorf("server pod reported %d of %d connections: %w", len(got), n, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// createServer creates the server Pod on node 2; it reports connections on
// its stdout.
func (r *apiRun) createServer(ctx context.Context, warmup, window time.Duration) (*corev1.Pod, error) {
	podIP := corev1.EnvVar{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}
	server := r.pod("server", r.bed.Node(2), []corev1.EnvVar{podIP},
		"serve", "-listen", fmt.Sprintf("$(POD_IP):%d", apiPort), "-mptcp",
		"-warmup", warmup.String(), "-window", window.String())
	return server, r.cp.Client.Create(ctx, server)
}

// showHeld creates the server Pod without agents and shows it held: it has
// its address, its init container waits for the agent's readiness gate,
// its workload has not started.
func (r *apiRun) showHeld(ctx context.Context) error {
	server, err := r.createServer(ctx, time.Second, time.Second)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(20 * time.Second)
	for server.Status.PodIP == "" && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if err := r.cp.Client.Get(ctx, client.ObjectKeyFromObject(server), server); err != nil {
			return err
		}
	}
	started := false
	for _, cs := range server.Status.ContainerStatuses {
		started = started || cs.State.Running != nil || cs.State.Terminated != nil
	}
	r.log("pod %s/%s on %s: phase %s, IP %s, conditions %s, workload started: %v (its init container waits for %s)",
		server.Namespace, server.Name, server.Spec.NodeName, server.Status.Phase, server.Status.PodIP, conditions(server), started, readyGate)
	return nil
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

func senderReports(out string) ([]testbed.SenderReport, error) {
	var reps []testbed.SenderReport
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r testbed.SenderReport
		if err := json.Unmarshal(sc.Bytes(), &r); err == nil {
			reps = append(reps, r)
		}
	}
	if len(reps) == 0 {
		return nil, fmt.Errorf("the client pod printed no connection report: %q", out)
	}
	return reps, nil
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
