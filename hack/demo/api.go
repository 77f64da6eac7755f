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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/e2e/framework"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed/controlplane"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed/kubelet"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/testenv"
)

// ScenarioAPI is the agent scenario as a cluster runs it: policies applied
// to the API server, the controller compiling them, agents reading their
// node's state, workloads started from Pod specs.
const ScenarioAPI = "MPTCP, agent via the API"

const (
	demoNamespace = "demo"
	// readyGate is the condition the agent sets on a pod once its MPTCP is
	// configured; the kubelet stand-in starts the workload only then.
	readyGate = "mptcp.io/ready"
	apiPort   = 5204
)

// apiRun is the control plane, kubelet stand-in and agents of the scenario.
type apiRun struct {
	bed    *testbed.Bed
	cp     *controlplane.ControlPlane
	k      *kubelet.Kubelet
	agents []*controlplane.Agent
	logs   string
	log    func(format string, args ...any)
}

// startAPI brings up the control plane (API server, config/agent, the
// controller binary), the kubelet stand-in for every bed node, one agent per
// node in kube mode, and applies examples/. Close stops everything.
func startAPI(ctx context.Context, bed *testbed.Bed, bins framework.Binaries, assets, logs string, log func(string, ...any)) (r *apiRun, err error) {
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
	log("starting the control plane: etcd, kube-apiserver, CRDs, config/agent, the controller ...")
	r = &apiRun{bed: bed, logs: logs, log: log}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.Close())
		}
	}()
	klog, err := os.Create(filepath.Join(logs, "kubelet.log"))
	if err != nil {
		return r, err
	}
	klogger := slog.New(slog.NewTextHandler(klog, nil))
	// controller-runtime's own logs (the control plane's, the stand-in's
	// caches) go there too: set before the first of them logs, as
	// controller-runtime takes only its first logger.
	ctrllog.SetLogger(logr.FromSlogHandler(klogger.Handler()))
	if r.cp, err = controlplane.Start(ctx, controlplane.Options{Assets: assets, Dir: logs, Controller: controller}); err != nil {
		return r, err
	}
	log("registering the bed's nodes with the kubelet stand-in ...")
	r.k, err = kubelet.Start(ctx, kubelet.Options{Bed: bed, Config: r.cp.Env.Config, Log: klogger})
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
	return r, r.cp.Client.Create(ctx, ns)
}

// startAgents starts one agent per node in kube mode; ErrNoKubeMode when the
// agent binary has none.
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
		cfg := framework.AgentConfig(r.bed, n, agent.Rule{})
		cfg.Node = r.k.NodeName(n)
		cfg.Paths, cfg.Rules, cfg.Pods, cfg.PodCIDRs = nil, nil, nil, nil
		raw, err := yaml.Marshal(cfg)
		if err != nil {
			return err
		}
		configs[n] = filepath.Join(r.logs, "agent-"+cfg.Node+".yaml")
		if err := os.WriteFile(configs[n], raw, 0o600); err != nil {
			return err
		}
	}
	var err error
	r.agents, err = r.cp.StartAgents(ctx, r.bed, bin, r.k.NodeName, func(n *testbed.Node) []string {
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

// Close stops the workloads, agents, controller and API server, in that order.
func (r *apiRun) Close() error {
	var errs []error
	if r.k != nil {
		errs = append(errs, r.k.Stop())
	}
	errs = append(errs, controlplane.StopAgents(r.agents))
	// The bed's directory goes with the bed: keep the agents' logs.
	for _, a := range r.agents {
		errs = append(errs, os.WriteFile(filepath.Join(r.logs, "agent-"+a.Name+".log"), []byte(a.Proc.ErrOutput()), 0o644))
	}
	if r.cp != nil {
		errs = append(errs, r.cp.Stop())
	}
	return errors.Join(errs...)
}

// pod is a demo Pod: one container running the traffic tool, held by the
// agent's readiness gate, on a named node.
func (r *apiRun) pod(name string, node *testbed.Node, env []corev1.EnvVar, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: demoNamespace, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:       r.k.NodeName(node),
			ReadinessGates: []corev1.PodReadinessGate{{ConditionType: readyGate}},
			Containers: []corev1.Container{{
				Name: "traffic", Image: "mptcp-operator/traffic",
				Command: args[:1], Args: args[1:], Env: env,
			}},
		},
	}
}

// waitStarted waits until the stand-in runs the pod's workload, which needs
// the agent to have set the readiness gate.
func (r *apiRun) waitStarted(ctx context.Context, name string, timeout time.Duration) (*testbed.Process, error) {
	key := types.NamespacedName{Namespace: demoNamespace, Name: name}
	deadline := time.Now().Add(timeout)
	for {
		if procs := r.k.Processes(key); procs != nil {
			return procs[0], nil
		}
		if time.Now().After(deadline) {
			pod := &corev1.Pod{}
			_ = r.cp.Client.Get(ctx, key, pod)
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

func conditions(p *corev1.Pod) string {
	var s []string
	for _, c := range p.Status.Conditions {
		s = append(s, fmt.Sprintf("%s=%s", c.Type, c.Status))
	}
	return "[" + strings.Join(s, " ") + "]"
}

// transfer runs the scenario's transfer: a server Pod on node 2 and a
// client Pod on node 1, both started by the kubelet stand-in from their
// specs, and measures it as framework.Transfer measures the other scenarios.
func (r *apiRun) transfer(ctx context.Context, bins framework.Binaries, duration, warmup time.Duration, conns int) (framework.Measurement, error) {
	m := framework.Measurement{Scenario: ScenarioAPI}
	window := duration - warmup - time.Second
	report := filepath.Join(r.logs, "serve.jsonl")
	_ = os.Remove(report)
	server, err := r.createServer(ctx, bins, report, warmup, window)
	if err != nil {
		return m, err
	}
	srvProc, err := r.waitStarted(ctx, "server", 60*time.Second)
	if err != nil {
		return m, err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := srvProc.WaitOutput(wctx, "listening on"); err != nil {
		return m, err
	}
	if err := r.cp.Client.Get(ctx, client.ObjectKeyFromObject(server), server); err != nil {
		return m, err
	}
	r.log("server pod runs %s on %s (%s)", bins.Traffic, server.Spec.NodeName, server.Status.PodIP)

	cli := r.pod("client", r.bed.Node(1), []corev1.EnvVar{{Name: "SERVER", Value: fmt.Sprintf("%s:%d", server.Status.PodIP, apiPort)}},
		bins.Traffic, "send", "-to", "$(SERVER)", "-mptcp", "-json", "-conns", fmt.Sprint(conns), "-duration", duration.String())
	if err := r.cp.Client.Create(ctx, cli); err != nil {
		return m, err
	}
	node := r.bed.Node(1)
	cliProc, err := r.waitStarted(ctx, "client", 60*time.Second)
	if err != nil {
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
	if err := cliProc.Wait(ctx); err != nil {
		return m, fmt.Errorf("client pod's traffic send: %w; stderr: %s", err, cliProc.ErrOutput())
	}
	m.End = time.Now()
	sent, err := senderReports(cliProc.Output())
	if err != nil {
		return m, err
	}
	srv := &testbed.TrafficServer{Report: report}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	got, err := srv.WaitReports(rctx, len(sent))
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

// createServer creates the server Pod on node 2.
func (r *apiRun) createServer(ctx context.Context, bins framework.Binaries, report string, warmup, window time.Duration) (*corev1.Pod, error) {
	podIP := corev1.EnvVar{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}
	server := r.pod("server", r.bed.Node(2), []corev1.EnvVar{podIP},
		bins.Traffic, "serve", "-listen", fmt.Sprintf("$(POD_IP):%d", apiPort), "-mptcp", "-report", report,
		"-warmup", warmup.String(), "-window", window.String())
	return server, r.cp.Client.Create(ctx, server)
}

// showHeld creates the server Pod without agents and shows the kubelet
// stand-in holding it: Running with its address, workload not started
// until the agent's readiness gate is True.
func (r *apiRun) showHeld(ctx context.Context, bins framework.Binaries) error {
	server, err := r.createServer(ctx, bins, filepath.Join(r.logs, "serve.jsonl"), time.Second, time.Second)
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
	started := r.k.Processes(client.ObjectKeyFromObject(server)) != nil
	r.log("pod %s/%s on %s: phase %s, IP %s, conditions %s, workload started: %v (held until %s is True)",
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
		if err := r.cp.Client.Get(ctx, client.ObjectKey{Name: r.k.NodeName(n)}, &st); err != nil {
			r.log("node state of %s: %v", r.k.NodeName(n), err)
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
