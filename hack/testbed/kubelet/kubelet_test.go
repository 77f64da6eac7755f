package kubelet_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed/kubelet"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/testenv"
)

// gate is the condition the agent sets once a pod's MPTCP is configured.
const gate = "mptcp.io/ready"

type fixture struct {
	env *testenv.Env
	bed *testbed.Bed
	k   *kubelet.Kubelet
	dir string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	env := testenv.Start(t)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1})
	k, err := kubelet.Start(context.Background(), kubelet.Options{Bed: bed, Config: env.Config})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Stop(); err != nil {
			t.Errorf("stop kubelet: %v", err)
		}
	})
	env.Namespace(t, "apps", nil)
	// The workloads write here from inside pod namespaces: same filesystem.
	return &fixture{env: env, bed: bed, k: k, dir: t.TempDir()}
}

// probePod runs a shell that records its environment and network namespace,
// then sleeps until killed.
func (f *fixture) probePod(name, node string, gates ...string) *corev1.Pod {
	out := filepath.Join(f.dir, name)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps"},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{
				Name: "probe", Image: "none",
				Command: []string{"sh", "-c"},
				Args:    []string{fmt.Sprintf("env > %[1]s.env.tmp && mv %[1]s.env.tmp %[1]s.env; readlink /proc/self/ns/net > %[1]s.ns.tmp && mv %[1]s.ns.tmp %[1]s.ns; exec sleep 600", out)},
				Env: []corev1.EnvVar{
					{Name: "GREETING", Value: "hello"},
					{Name: "ECHO", Value: "$(GREETING) world"},
					{Name: "MY_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
				},
			}},
		},
	}
	for _, g := range gates {
		p.Spec.ReadinessGates = append(p.Spec.ReadinessGates, corev1.PodReadinessGate{ConditionType: corev1.PodConditionType(g)})
	}
	return p
}

func waitFor(t *testing.T, what string, timeout time.Duration, ok func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		done, err := ok()
		if done {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s (last error: %v)", timeout, what, last)
}

func (f *fixture) get(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{}
	if err := f.env.Client.Get(context.Background(), types.NamespacedName{Namespace: "apps", Name: name}, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func readEnv(path string) (map[string]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		env[k] = v
	}
	return env, nil
}

func netnsInode(t *testing.T, name string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat("/var/run/netns/"+name, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("net:[%d]", st.Ino)
}

func TestRegistersNodes(t *testing.T) {
	f := setup(t)
	for _, n := range f.bed.Nodes {
		node := &corev1.Node{}
		if err := f.env.Client.Get(context.Background(), client.ObjectKey{Name: f.k.NodeName(n)}, node); err != nil {
			t.Fatalf("node %d: %v", n.Index, err)
		}
		if node.Spec.PodCIDR != n.PodCIDR.String() {
			t.Errorf("node %s: podCIDR %q, want %s", node.Name, node.Spec.PodCIDR, n.PodCIDR)
		}
		if node.Labels[kubelet.LabelMultipath] != "true" || node.Labels[corev1.LabelHostname] != node.Name {
			t.Errorf("node %s: labels %v lack mptcp.io/multipath=true or the hostname", node.Name, node.Labels)
		}
		var ips []string
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ips = append(ips, a.Address)
			}
		}
		want := []string{n.NIC(1).Addr.Addr().String(), n.NIC(2).Addr.Addr().String()}
		if strings.Join(ips, ",") != strings.Join(want, ",") {
			t.Errorf("node %s: internal IPs %v, want %v", node.Name, ips, want)
		}
		ready := false
		for _, c := range node.Status.Conditions {
			ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
		}
		if !ready {
			t.Errorf("node %s is not Ready: %+v", node.Name, node.Status.Conditions)
		}
	}
}

// A pod bound to a bed node runs in a bed pod namespace with that
// namespace's address, its workload started from the spec's command and
// environment inside that namespace.
func TestPodRunsWorkloadFromSpec(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	node := f.bed.Node(2)
	pod := f.probePod("probe", f.k.NodeName(node))
	if err := f.env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	slot := node.Pods[0]
	waitFor(t, "pod Running and Ready with the slot's IP", 30*time.Second, func() (bool, error) {
		p := f.get(t, "probe")
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP == slot.Addr.String() && isReady(p), fmt.Errorf("status %+v", p.Status)
	})
	p := f.get(t, "probe")
	if p.Annotations[kubelet.AnnotationNetNS] != "/var/run/netns/"+slot.NetNS || p.Annotations[kubelet.AnnotationHostInterface] != slot.HostIf {
		t.Errorf("slot annotations %v, want netns %s and host interface %s", p.Annotations, slot.NetNS, slot.HostIf)
	}
	if len(p.Status.PodIPs) != 1 || p.Status.PodIPs[0].IP != slot.Addr.String() {
		t.Errorf("podIPs %v, want [%s]", p.Status.PodIPs, slot.Addr)
	}
	out := filepath.Join(f.dir, "probe")
	var env map[string]string
	waitFor(t, "the workload's environment file", 10*time.Second, func() (bool, error) {
		var err error
		env, err = readEnv(out + ".env")
		return err == nil, err
	})
	want := map[string]string{"GREETING": "hello", "ECHO": "hello world", "MY_IP": slot.Addr.String(), "HOSTNAME": "probe"}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("workload env %s=%q, want %q (env: %v)", k, env[k], v, env)
		}
	}
	// env -i: nothing of the test process's environment leaks in.
	if _, ok := env["HOME"]; ok {
		t.Errorf("workload inherited HOME from the stand-in: %v", env)
	}
	waitFor(t, "the workload's netns file", 10*time.Second, func() (bool, error) {
		_, err := os.Stat(out + ".ns")
		return err == nil, err
	})
	ns, _ := os.ReadFile(out + ".ns")
	if got, want := strings.TrimSpace(string(ns)), netnsInode(t, slot.NetNS); got != want {
		t.Errorf("workload ran in netns %s, want the slot's %s (%s)", got, want, slot.NetNS)
	}
}

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// A readiness gate holds the workload: the pod is Running with its IP (the
// agent needs both to configure it) but nothing starts until the gate's
// condition is True.
func TestReadinessGateHoldsWorkload(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	pod := f.probePod("gated", f.k.NodeName(f.bed.Node(1)), gate)
	if err := f.env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: "apps", Name: "gated"}
	waitFor(t, "pod Running with an IP", 30*time.Second, func() (bool, error) {
		p := f.get(t, "gated")
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
	})
	// Long enough for a wrongly started shell to have written its file.
	time.Sleep(2 * time.Second)
	if procs := f.k.Processes(key); procs != nil {
		t.Fatalf("workload started before the gate was True (pid %d)", procs[0].PID)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "gated.env")); err == nil {
		t.Fatal("the workload ran before the gate was True")
	}
	if isReady(f.get(t, "gated")) {
		t.Fatal("pod Ready before its gate")
	}

	// A False condition still holds it.
	setGate(t, f, "gated", corev1.ConditionFalse)
	time.Sleep(time.Second)
	if f.k.Processes(key) != nil {
		t.Fatal("workload started with the gate False")
	}

	setGate(t, f, "gated", corev1.ConditionTrue)
	waitFor(t, "the gated workload to start", 15*time.Second, func() (bool, error) {
		_, err := os.Stat(filepath.Join(f.dir, "gated.env"))
		return err == nil, err
	})
	waitFor(t, "pod Ready", 10*time.Second, func() (bool, error) { return isReady(f.get(t, "gated")), nil })
	// The stand-in's own status writes kept the agent's condition.
	p := f.get(t, "gated")
	found := false
	for _, c := range p.Status.Conditions {
		found = found || (string(c.Type) == gate && c.Status == corev1.ConditionTrue)
	}
	if !found {
		t.Errorf("the gate condition was lost: %+v", p.Status.Conditions)
	}
}

// setGate writes the gate condition as the agent does: a strategic merge
// patch of that condition only.
func setGate(t *testing.T, f *fixture, name string, s corev1.ConditionStatus) {
	t.Helper()
	p := f.get(t, name)
	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q,"lastTransitionTime":%q}]}}`, gate, s, time.Now().UTC().Format(time.RFC3339))
	if err := f.env.Client.Status().Patch(context.Background(), p, client.RawPatch(types.StrategicMergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// Deleting a pod stops its workload by PID, frees its slot for the next
// pod and removes the Pod (no finalizer, no grace left to expire).
func TestDeleteStopsWorkload(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	node := f.bed.Node(1)
	key := types.NamespacedName{Namespace: "apps", Name: "victim"}
	if err := f.env.Client.Create(ctx, f.probePod("victim", f.k.NodeName(node))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the workload to start", 30*time.Second, func() (bool, error) { return f.k.Processes(key) != nil, nil })
	proc := f.k.Processes(key)[0]
	waitFor(t, "the workload to run", 10*time.Second, func() (bool, error) {
		_, err := os.Stat(filepath.Join(f.dir, "victim.ns"))
		return err == nil, err
	})
	if f.k.FreeSlots(node) != 0 {
		t.Fatalf("node 1 has %d free slots with its one pod running", f.k.FreeSlots(node))
	}

	// A second pod on the full node waits for the slot.
	if err := f.env.Client.Create(ctx, f.probePod("next", f.k.NodeName(node))); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if p := f.get(t, "next"); p.Status.PodIP != "" {
		t.Fatalf("second pod got IP %s on a full node", p.Status.PodIP)
	}

	if err := f.env.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "victim", Namespace: "apps"}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-proc.Done():
	case <-time.After(15 * time.Second):
		t.Fatalf("workload pid %d still runs after its pod was deleted", proc.PID)
	}
	if err := syscall.Kill(proc.PID, 0); err != syscall.ESRCH {
		t.Errorf("pid %d still exists after the deletion (kill 0: %v)", proc.PID, err)
	}
	waitFor(t, "the Pod to be gone", 15*time.Second, func() (bool, error) {
		err := f.env.Client.Get(ctx, key, &corev1.Pod{})
		return apierrors.IsNotFound(err), err
	})
	waitFor(t, "the freed slot to go to the waiting pod", 15*time.Second, func() (bool, error) {
		p := f.get(t, "next")
		return p.Status.PodIP == node.Pods[0].Addr.String() && p.Status.Phase == corev1.PodRunning, fmt.Errorf("status %+v", p.Status)
	})
}

// A pending pod whose nodeSelector names a bed node by hostname is bound to it.
func TestBindsByHostnameSelector(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	node := f.bed.Node(2)
	pod := f.probePod("unbound", "")
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: f.k.NodeName(node)}
	if err := f.env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pod bound and Running", 30*time.Second, func() (bool, error) {
		p := f.get(t, "unbound")
		return p.Spec.NodeName == f.k.NodeName(node) && p.Status.PodIP == node.Pods[0].Addr.String(), nil
	})
}

// A container without a command cannot run here (no images): the pod fails
// with the reason instead of hanging.
func TestPodWithoutCommandFails(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	pod := f.probePod("nocmd", f.k.NodeName(f.bed.Node(1)))
	pod.Spec.Containers[0].Command, pod.Spec.Containers[0].Args = nil, nil
	if err := f.env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pod Failed with a reason", 30*time.Second, func() (bool, error) {
		p := f.get(t, "nocmd")
		return p.Status.Phase == corev1.PodFailed && strings.Contains(p.Status.Message, "no command"), nil
	})
}

// Stopping the stand-in stops every workload it started, by PID.
func TestStopStopsWorkloads(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "apps", Name: "orphan"}
	if err := f.env.Client.Create(ctx, f.probePod("orphan", f.k.NodeName(f.bed.Node(1)))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the workload to start", 30*time.Second, func() (bool, error) { return f.k.Processes(key) != nil, nil })
	proc := f.k.Processes(key)[0]
	if err := f.k.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-proc.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("workload pid %d outlived the stand-in", proc.PID)
	}
}
