package conformance

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/compile"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

var testVMEnv = VMEnv{Env: Env{TrafficImage: "traffic:test", PullPolicy: corev1.PullNever, Duration: 10 * time.Second},
	Image: "quay.io/containerdisks/fedora:41"}

// The VM case's objects, as KubeVirt would turn them into a virt-launcher
// pod, are selected by examples/policy-spread.yaml and compiled into guest
// mode with a VMGuestMode notice by the controller's own compiler; the VM
// gets its server and the binding asked for. What can be checked without
// KubeVirt (the case itself runs where KubeVirt does).
func TestVMCaseObjectsAreSelectedAndGetGuestMode(t *testing.T) {
	for _, binding := range Bindings {
		t.Run(binding, func(t *testing.T) {
			env := testVMEnv
			env.Binding = binding
			o, err := NewVMObjects(env, "ns-vm", "node-a", "node-b")
			if err != nil {
				t.Fatal(err)
			}
			spec := o.VMI.Object["spec"].(map[string]any)
			devices := spec["domain"].(map[string]any)["devices"].(map[string]any)
			iface := devices["interfaces"].([]any)[0].(map[string]any)
			if _, ok := iface[binding]; !ok || devices["logSerialConsole"] != true {
				t.Errorf("the VMI's interface %v, logSerialConsole %v; want %s and true", iface, devices["logSerialConsole"], binding)
			}
			if sel := spec["nodeSelector"].(map[string]any)[corev1.LabelHostname]; sel != "node-b" {
				t.Errorf("the VMI runs on %v, want node-b", sel)
			}
			if got := o.Client.Spec.NodeName; got != "node-a" || !slices.Contains(o.Client.Spec.Containers[0].Args, fmt.Sprintf("%s:%d", vmAddressPlaceholder, serverPort)) {
				t.Errorf("the client runs on %s with %v; want node-a, sending to the VM's port %d", got, o.Client.Spec.Containers[0].Args, serverPort)
			}
			requireUserDataRunsTheServer(t, o.UserData)
			requireGuestMode(t, o, launcherPodFor(o.VMI, "node-b"))
		})
	}
	if _, err := NewVMObjects(VMEnv{Binding: "passt"}, "ns", "a", "b"); err == nil || !strings.Contains(err.Error(), "masquerade") {
		t.Errorf("an unknown binding: error %v, want one naming the known ones", err)
	}
}

// launcherPodFor is the pod KubeVirt makes for vmi: its labels, KubeVirt's
// own, on node, running.
func launcherPodFor(vmi *unstructured.Unstructured, node string) corev1.Pod {
	l := map[string]string{compile.LabelVirtLauncher: compile.LabelVirtLauncherValue, kubeVirtVMLabel: vmi.GetName()}
	for k, v := range vmi.GetLabels() {
		l[k] = v
	}
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: vmi.GetNamespace(), Name: "virt-launcher-" + vmi.GetName() + "-x7k2q", UID: "uid-launcher", Labels: l},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.2.7", PodIPs: []corev1.PodIP{{IP: "10.244.2.7"}}},
	}
}

func requireUserDataRunsTheServer(t *testing.T, s *corev1.Secret) {
	t.Helper()
	data := s.StringData["userdata"]
	if !strings.HasPrefix(data, "#cloud-config\n") {
		t.Fatalf("user data does not start with #cloud-config:\n%s", data)
	}
	var cfg struct {
		WriteFiles []struct{ Path, Permissions, Encoding, Content string } `json:"write_files"`
		RunCmd     [][]string                                              `json:"runcmd"`
	}
	if err := yaml.UnmarshalStrict([]byte(data), &cfg); err != nil {
		t.Fatalf("user data: %v\n%s", err, data)
	}
	if len(cfg.WriteFiles) != 1 || cfg.WriteFiles[0].Path != vmServerPath || cfg.WriteFiles[0].Encoding != "b64" {
		t.Fatalf("write_files %+v, want the server at %s", cfg.WriteFiles, vmServerPath)
	}
	if got, err := base64.StdEncoding.DecodeString(cfg.WriteFiles[0].Content); err != nil || !bytes.Equal(got, vmServer) {
		t.Errorf("the server written to the VM differs from vmserver.py (%v)", err)
	}
	want := []string{"systemd-run", "--unit=" + vmServerUnit, vmServerPath, "--port", fmt.Sprint(serverPort), "--out", "/dev/ttyS0"}
	if len(cfg.RunCmd) != 1 || !slices.Equal(cfg.RunCmd[0], want) {
		t.Errorf("runcmd %v, want %v", cfg.RunCmd, want)
	}
}

// requireGuestMode compiles the VM's node with the examples the case
// needs and checks the VM's pod gets guest mode from policy-spread.
func requireGuestMode(t *testing.T, o *VMObjects, launcher corev1.Pod) {
	t.Helper()
	paths, policies := readExamples(t, "paths.yaml", "policy-spread.yaml")
	for i := range paths {
		paths[i].Status.Index = int32(i + 1)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: launcher.Spec.NodeName, Labels: map[string]string{multipathLabel: "true"}},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.2.0/24"}}}
	res := compile.Node(compile.Input{Node: node, Paths: paths, Policies: policies,
		NamespaceLabels: map[string]map[string]string{o.Namespace.Name: o.Namespace.Labels}, Pods: []corev1.Pod{launcher}})
	if len(res.Spec.Pods) != 1 || len(res.Spec.Pods[0].Rules) == 0 {
		t.Fatalf("no policy of the examples selects the VM's pod (labels %v, namespace labels %v): pods %+v",
			launcher.Labels, o.Namespace.Labels, res.Spec.Pods)
	}
	for _, name := range res.Spec.Pods[0].Rules {
		if r := res.Spec.Rule(name); r.SubflowCreation != mptcpv1alpha1.SubflowCreationGuest {
			t.Errorf("the VM pod's rule %s is in %s mode, want guest", name, r.SubflowCreation)
		}
	}
	if len(res.Refusals) != 1 || res.Refusals[0].Reason != compile.ReasonVMGuestMode {
		t.Errorf("notices %+v, want one %s (the case waits for its event)", res.Refusals, compile.ReasonVMGuestMode)
	}
}

func readExamples(t *testing.T, files ...string) ([]mptcpv1alpha1.MPTCPPath, []mptcpv1alpha1.MPTCPPolicy) {
	t.Helper()
	var paths []mptcpv1alpha1.MPTCPPath
	var policies []mptcpv1alpha1.MPTCPPolicy
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "examples", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range testutil.YAMLDocuments(t, data) {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatal(err)
			}
			switch meta.Kind {
			case "MPTCPPath":
				var p mptcpv1alpha1.MPTCPPath
				testbed.Must(t, yaml.UnmarshalStrict(doc, &p))
				paths = append(paths, p)
			case "MPTCPPolicy":
				var p mptcpv1alpha1.MPTCPPolicy
				testbed.Must(t, yaml.UnmarshalStrict(doc, &p))
				policies = append(policies, p)
			}
		}
	}
	return paths, policies
}

// The dry run prints the namespace, the user data, the VMI and the client,
// and creates nothing (it is given no cluster).
func TestVMCaseDryRunPrintsItsObjects(t *testing.T) {
	out, err := DryRunVM(testVMEnv)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, doc := range strings.Split(out, "---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("a document of the dry run: %v\n%s", err, doc)
		}
		kind, _ := m["kind"].(string)
		if kind == "" {
			// Typed objects print no TypeMeta: tell them by their fields.
			switch {
			case m["stringData"] != nil:
				kind = "Secret"
			case m["spec"] != nil && m["spec"].(map[string]any)["containers"] != nil:
				kind = "Pod"
			default:
				kind = "Namespace"
			}
		}
		kinds = append(kinds, kind)
	}
	if want := []string{"Namespace", "Secret", "VirtualMachineInstance", "Pod"}; !slices.Equal(kinds, want) {
		t.Errorf("the dry run printed %v, want %v:\n%s", kinds, want, out)
	}
}

// The VM's server, run here with Python as the VM runs it (over loopback
// with MPTCP), reports each stream's length and hash and that MPTCP held;
// matchByContent pairs the streams sent with those reports and names a
// stream that arrived changed.
func TestVMServerReportsWhatArrived(t *testing.T) {
	python, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		testutil.Unavailable(t, "needs Debian's python3 (make deps): %v", err)
	}
	dir := t.TempDir()
	script, out := filepath.Join(dir, "vmserver.py"), filepath.Join(dir, "console")
	testbed.Must(t, os.WriteFile(script, vmServer, 0o755))
	testbed.Must(t, os.WriteFile(out, nil, 0o644))
	cmd := exec.Command(python, script, "--host", "127.0.0.1", "--port", "0", "--out", out)
	cmd.Stderr = os.Stderr
	testbed.Must(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	var port int
	for deadline := time.Now().Add(10 * time.Second); port == 0; time.Sleep(50 * time.Millisecond) {
		data, _ := os.ReadFile(out)
		_, _ = fmt.Sscanf(string(data), "mptcp-conformance-server listening on port %d", &port)
		if time.Now().After(deadline) {
			t.Fatalf("the server did not listen within 10 s: %q", data)
		}
	}
	// The conns connections the case sends, and one of plain TCP, which
	// the server must report as fallen back.
	var sent []testbed.SenderReport
	for i := range conns + 1 {
		d := net.Dialer{}
		d.SetMultipathTCP(i < conns)
		c, err := d.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatal(err)
		}
		mptcp, _ := c.(*net.TCPConn).MultipathTCP()
		buf := make([]byte, 3<<20+i)
		_, _ = rand.NewChaCha8([32]byte{byte(i)}).Read(buf)
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		testbed.Must(t, c.Close())
		sum := sha256.Sum256(buf)
		sent = append(sent, testbed.SenderReport{Conn: i, Local: c.LocalAddr().String(), MPTCP: mptcp, Bytes: int64(len(buf)), SHA256: hex.EncodeToString(sum[:])})
	}
	var got []testbed.ServerReport
	for deadline := time.Now().Add(10 * time.Second); len(got) < len(sent); time.Sleep(50 * time.Millisecond) {
		data, _ := os.ReadFile(out)
		got = nodes.JSONLines[testbed.ServerReport](string(data))
		if time.Now().After(deadline) {
			t.Fatalf("%d reports within 10 s, want %d: %q", len(got), conns, data)
		}
	}
	plain := sent[conns]
	sent = sent[:conns]
	if err := matchByContent(sent, got); err != nil {
		t.Errorf("the streams as the server reported them: %v", err)
	}
	for _, s := range sent {
		if !s.MPTCP {
			t.Errorf("connection %d fell back to TCP over loopback: the server's MPTCP report is untested", s.Conn)
		}
	}
	if err := matchByContent([]testbed.SenderReport{plain}, got); err == nil || !strings.Contains(err.Error(), "fell back to TCP") {
		t.Errorf("a plain TCP connection: error %v, want the server to report it fell back to TCP", err)
	}
	changed := slices.Clone(sent)
	changed[1].SHA256 = strings.Repeat("0", 64)
	if err := matchByContent(changed, got); err == nil || !strings.Contains(err.Error(), "connection 1") {
		t.Errorf("a stream that arrived other than sent: error %v, want one naming connection 1", err)
	}
}
