package conformance

import (
	"context"
	_ "embed"
	"encoding/base64"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/mptcp-operator/mptcp-operator/internal/controller/compile"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
)

// The VM case checks what the operator does for a KubeVirt VM on a cluster
// that runs KubeVirt, with the same prerequisites as Run (the paths of
// examples/paths.yaml and the policy of examples/policy-spread.yaml, which
// selects namespaces labelled mptcp.io/tenant=enabled in userspace mode):
//
//   - a VMI on the second node, from a stock cloud image (a containerDisk),
//     runs an MPTCP server of the standard library's Python (vmserver.py,
//     delivered by cloud-init) and configures nothing else: a VM server
//     needs nothing for its client's joins (docs/vms.md);
//   - a client pod on the first node sends it MPTCP connections; its agent
//     opens their joins as the pod's path manager;
//   - the controller gives the VM's virt-launcher pod guest mode, and says
//     so with a VMGuestMode event, since policy-spread asks for userspace;
//   - the streams arrive whole (the server's byte counts and hashes, read
//     from the VM's serial console, equal the client's), both nodes' agents
//     carried them over two paths: the client's node its data, the VM's
//     node the VM's acknowledgements, each subflow's on the path it came
//     in on.
//
// KubeVirt is not available where this project is developed: what runs
// there is VMObjects and the server program (TestVMCase*), and the same
// host behaviour with real VMs in the e2e suite (TestGuest).

// VMEnv is the cluster to check, for the VM case.
type VMEnv struct {
	Env
	// Image is the VM's containerDisk: a cloud image with cloud-init,
	// Python 3.8 or later and MPTCP in its kernel (Linux 5.16 or later).
	Image string
	// Binding is the VM's pod network binding: masquerade or bridge.
	Binding string
}

// Bindings are the pod network bindings the VM case knows.
var Bindings = []string{"masquerade", "bridge"}

//go:embed vmserver.py
var vmServer []byte

const (
	vmName       = "server-vm"
	vmServerPath = "/usr/local/bin/mptcp-conformance-server"
	// vmServerUnit runs the server beside cloud-init rather than in it:
	// runcmd waits for what it starts.
	vmServerUnit = "mptcp-conformance-server"
	// kubeVirtVMLabel is the label KubeVirt gives a virt-launcher pod
	// with its VMI's name.
	kubeVirtVMLabel = "vm.kubevirt.io/name"
)

// VMIGroupVersion is the API group and version of KubeVirt's VMIs.
var VMIGroupVersion = schema.GroupVersion{Group: "kubevirt.io", Version: "v1"}

// VMObjects are what the VM case creates, in this order.
type VMObjects struct {
	Namespace *corev1.Namespace
	// UserData holds the VM's cloud-init user data: more than the 2 KiB
	// KubeVirt accepts inline.
	UserData *corev1.Secret
	VMI      *unstructured.Unstructured
	// Client is created once the VM listens; its -to is completed then,
	// with the virt-launcher pod's address (vmAddressPlaceholder).
	Client *corev1.Pod
}

// vmAddressPlaceholder stands for the VM's address in Client's arguments
// until the VM has one.
const vmAddressPlaceholder = "VM_ADDRESS"

// NewVMObjects returns the VM case's objects for namespace ns, the client
// on node sender and the VM on node receiver.
func NewVMObjects(env VMEnv, ns, sender, receiver string) (*VMObjects, error) {
	binding := env.Binding
	if binding == "" {
		binding = Bindings[0]
	}
	known := false
	for _, b := range Bindings {
		known = known || b == binding
	}
	if !known {
		return nil, fmt.Errorf("binding %q: want one of %v", binding, Bindings)
	}
	userData, err := vmUserData()
	if err != nil {
		return nil, err
	}
	o := &VMObjects{
		Namespace: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"mptcp.io/tenant": "enabled"}}},
		UserData: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: vmName + "-userdata", Namespace: ns},
			StringData: map[string]string{"userdata": userData}},
	}
	o.VMI = &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": VMIGroupVersion.String(),
		"kind":       "VirtualMachineInstance",
		"metadata": map[string]any{
			"name": vmName, "namespace": ns,
			// KubeVirt copies these to the virt-launcher pod, where
			// the policy's selectors meet them.
			"labels": map[string]any{"app": vmName},
		},
		"spec": map[string]any{
			"nodeSelector": map[string]any{corev1.LabelHostname: receiver},
			"domain": map[string]any{
				"cpu":    map[string]any{"cores": int64(1)},
				"memory": map[string]any{"guest": "1Gi"},
				"devices": map[string]any{
					// The server's reports reach the test as the
					// guest-console-log container's log.
					"logSerialConsole": true,
					"disks": []any{
						map[string]any{"name": "root", "disk": map[string]any{"bus": "virtio"}},
						map[string]any{"name": "cloudinit", "disk": map[string]any{"bus": "virtio"}},
					},
					"interfaces": []any{map[string]any{"name": "default", binding: map[string]any{}}},
				},
			},
			"networks": []any{map[string]any{"name": "default", "pod": map[string]any{}}},
			"volumes": []any{
				map[string]any{"name": "root", "containerDisk": map[string]any{"image": env.Image}},
				map[string]any{"name": "cloudinit", "cloudInitNoCloud": map[string]any{"secretRef": map[string]any{"name": o.UserData.Name}}},
			},
		},
	}}
	o.Client = nodes.TrafficPod(ns, "client", sender, env.TrafficImage, map[string]string{"app": "client"}, nil,
		"send", "-to", fmt.Sprintf("%s:%d", vmAddressPlaceholder, serverPort), "-mptcp", "-json",
		"-conns", fmt.Sprint(conns), "-duration", env.Duration.String(), "-seed", "12")
	setPullPolicy(o.Client, env.PullPolicy)
	return o, nil
}

// vmUserData is the VM's cloud-config: the server program, and a
// transient unit that runs it.
func vmUserData() (string, error) {
	cfg := map[string]any{
		"write_files": []any{map[string]any{
			"path": vmServerPath, "permissions": "0755", "encoding": "b64",
			"content": base64.StdEncoding.EncodeToString(vmServer),
		}},
		"runcmd": []any{[]any{"systemd-run", "--unit=" + vmServerUnit, vmServerPath, "--port", strconv.Itoa(serverPort), "--out", "/dev/ttyS0"}},
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return "", err
	}
	return "#cloud-config\n" + string(out), nil
}

// DryRunVM prints the VM case's objects as YAML documents, for nodes named
// SENDER and RECEIVER, without a cluster.
func DryRunVM(env VMEnv) (string, error) {
	o, err := NewVMObjects(env, "mptcp-conformance-vm-DRYRUN", "SENDER", "RECEIVER")
	if err != nil {
		return "", err
	}
	var docs []string
	for _, obj := range []any{o.Namespace, o.UserData, o.VMI.Object, o.Client} {
		out, err := yaml.Marshal(obj)
		if err != nil {
			return "", err
		}
		docs = append(docs, string(out))
	}
	return strings.Join(docs, "---\n"), nil
}

// RunVM checks the cluster of env with a VM; every failure is the test's.
func RunVM(t *testing.T, env VMEnv) {
	t.Helper()
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Discovery().ServerResourcesForGroupVersion(VMIGroupVersion.String()); err != nil {
		t.Fatalf("the cluster serves no %s (%v): the VM case needs KubeVirt installed", VMIGroupVersion, err)
	}
	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sender, receiver, senderAgent := pickNodes(t, ctx, cs, env.Env)
	receiverAgent := agentOn(t, ctx, cs, env.Env, receiver)
	t.Logf("sending from node %s (agent %s) to a VM on node %s (agent %s), %s binding", sender, senderAgent, receiver, receiverAgent, env.Binding)

	ns := "mptcp-conformance-vm-" + randomSuffix()
	o, err := NewVMObjects(env, ns, sender, receiver)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, o.Namespace); err != nil {
		t.Fatal(err)
	}
	defer deleteNamespace(t, cs, ns)
	if err := nodes.AllowAwait(ctx, c, ns); err != nil {
		t.Fatal(err)
	}
	if env.MetricsAuth {
		env.metricsToken = metricsReaderToken(t, ctx, cs, ns)
	}
	for _, obj := range []client.Object{o.UserData, o.VMI} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	launcher := waitVMListening(t, ctx, cs, ns, 10*time.Minute)
	t.Logf("the VM runs in pod %s, address %s", launcher.Name, launcher.Status.PodIP)
	requireGuestModeEvent(t, ctx, cs, launcher)

	beforeSent := pathTxBytes(t, cs, env.Env, senderAgent)
	beforeVM := pathTxBytes(t, cs, env.Env, receiverAgent)
	for i, a := range o.Client.Spec.Containers[0].Args {
		o.Client.Spec.Containers[0].Args[i] = strings.ReplaceAll(a, vmAddressPlaceholder, launcher.Status.PodIP)
	}
	if err := c.Create(ctx, o.Client); err != nil {
		t.Fatal(err)
	}
	waitSucceeded(t, c, o.Client, 2*time.Minute+env.Duration)
	sent := nodes.JSONLines[testbed.SenderReport](podLog(t, cs, o.Client))
	if len(sent) != conns {
		t.Fatalf("the client reported %d connections, want %d:\n%s", len(sent), conns, podLog(t, cs, o.Client))
	}
	var got []testbed.ServerReport
	for deadline := time.Now().Add(30 * time.Second); len(got) < len(sent) && time.Now().Before(deadline); time.Sleep(time.Second) {
		got = nodes.JSONLines[testbed.ServerReport](consoleLog(t, cs, launcher))
	}
	if err := matchByContent(sent, got); err != nil {
		t.Fatalf("the streams did not arrive whole: %v", err)
	}
	var total float64
	for _, r := range sent {
		total += float64(r.Bytes)
	}
	requireTwoPaths(t, "the client's node "+sender, beforeSent, pathTxBytes(t, cs, env.Env, senderAgent), total, minPathShare)
	// The VM's node sends its acknowledgements, each subflow's on the
	// path its data came in on: about as much on each path as the
	// client's node sent data there.
	vmSent := requireTwoPaths(t, "the VM's node "+receiver, beforeVM, pathTxBytes(t, cs, env.Env, receiverAgent), 0, minPathShare)
	t.Logf("the VM's node sent %.0f bytes of acknowledgements over its paths for %.0f bytes received", vmSent, total)
}

// agentOn is the running agent pod on node.
func agentOn(t *testing.T, ctx context.Context, cs kubernetes.Interface, env Env, node string) string {
	t.Helper()
	pods, err := cs.CoreV1().Pods(env.AgentNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=agent"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning {
			return p.Name
		}
	}
	t.Fatalf("no running agent pod on node %s in namespace %s", node, env.AgentNamespace)
	return ""
}

// waitVMListening waits for the VM's virt-launcher pod and for the server
// in the VM to say it listens, and returns the pod.
func waitVMListening(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var launcher *corev1.Pod
	for deadline := time.Now().Add(timeout); ; time.Sleep(2 * time.Second) {
		if launcher == nil || launcher.Status.PodIP == "" {
			pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kubeVirtVMLabel + "=" + vmName})
			if err != nil {
				t.Fatal(err)
			}
			if len(pods.Items) == 1 {
				launcher = &pods.Items[0]
			}
		}
		if launcher != nil && launcher.Status.PodIP != "" {
			if log, err := consoleLogErr(cs, launcher); err == nil && strings.Contains(log, "mptcp-conformance-server listening") {
				return launcher
			}
		}
		if time.Now().After(deadline) {
			log := ""
			if launcher != nil {
				log, _ = consoleLogErr(cs, launcher)
			}
			t.Fatalf("the VM's server did not listen within %v (virt-launcher pod %v); its console:\n%s", timeout, launcher != nil, tail(log, 40))
		}
	}
}

// requireGuestModeEvent checks the controller said the VM's pod gets
// guest mode, which policy-spread's userspace cannot give a VM.
func requireGuestModeEvent(t *testing.T, ctx context.Context, cs kubernetes.Interface, launcher *corev1.Pod) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		evs, err := cs.CoreV1().Events(launcher.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + launcher.Name})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			if e.Reason == compile.ReasonVMGuestMode && e.Type == corev1.EventTypeWarning {
				t.Logf("event on %s: %s", launcher.Name, e.Message)
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event on the VM's pod %s within a minute: did a policy select it?", compile.ReasonVMGuestMode, launcher.Name)
		}
	}
}

// matchByContent pairs each stream sent with a server report of the same
// length and hash: a VM behind masquerade sees its peers' addresses as
// KubeVirt's NAT leaves them, so addresses cannot pair them.
func matchByContent(sent []testbed.SenderReport, got []testbed.ServerReport) error {
	var problems []string
	for _, s := range sent {
		found := false
		for _, g := range got {
			if g.Bytes == s.Bytes && g.SHA256 == s.SHA256 {
				found = true
				if !g.MPTCP {
					problems = append(problems, fmt.Sprintf("connection %d arrived whole but fell back to TCP", s.Conn))
				}
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("connection %d (%d bytes, sha256 %.12s) has no server report of the same length and hash", s.Conn, s.Bytes, s.SHA256))
		}
		if s.Error != "" {
			problems = append(problems, fmt.Sprintf("connection %d: the client reported %s", s.Conn, s.Error))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	var reports []string
	for _, g := range got {
		reports = append(reports, fmt.Sprintf("%s->%s %d bytes sha256 %.12s mptcp %v %s", g.Remote, g.Local, g.Bytes, g.SHA256, g.MPTCP, g.Error))
	}
	return fmt.Errorf("%s; the server reported: %s", strings.Join(problems, "; "), strings.Join(reports, "; "))
}

// requireTwoPaths checks that at least two paths each carried share of
// what an agent counted between before and after (of total, when it is
// not 0), and returns what the paths carried.
func requireTwoPaths(t *testing.T, who string, before, after map[string]float64, total, share float64) float64 {
	t.Helper()
	var sum float64
	for path, n := range after {
		sum += n - before[path]
	}
	if total == 0 {
		total = sum
	}
	var carried []string
	for path, n := range after {
		d := n - before[path]
		t.Logf("%s: path %s carried %.0f bytes, %.0f%%", who, path, d, 100*d/total)
		if total > 0 && d/total >= share {
			carried = append(carried, path)
		}
	}
	if len(carried) < 2 {
		t.Errorf("%s carried the transfer over %v; want at least two paths with %.0f%% each", who, carried, 100*share)
	}
	return sum
}

// consoleLog is the VM's serial console, as KubeVirt logs it.
func consoleLog(t *testing.T, cs kubernetes.Interface, launcher *corev1.Pod) string {
	t.Helper()
	log, err := consoleLogErr(cs, launcher)
	if err != nil {
		t.Fatalf("the console log of %s: %v", launcher.Name, err)
	}
	return log
}

func consoleLogErr(cs kubernetes.Interface, launcher *corev1.Pod) (string, error) {
	raw, err := cs.CoreV1().Pods(launcher.Namespace).GetLogs(launcher.Name, &corev1.PodLogOptions{Container: "guest-console-log"}).DoRaw(context.Background())
	return string(raw), err
}

var lineEnd = regexp.MustCompile(`\r?\n`)

func tail(s string, n int) string {
	lines := lineEnd.Split(s, -1)
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
