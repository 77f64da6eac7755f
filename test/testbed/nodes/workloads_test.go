package nodes_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
)

// What a chart install needs from the cluster: a DaemonSet's pods on every
// node (the daemonset controller), in the node's network namespace
// (hostNetwork), whose hostPath volumes are the node's own standard paths:
// /sys/fs/bpf (HostToContainer, as the chart mounts it) is the bed's pin
// directory of that node, and /var/run/netns,
// mounted HostToContainer, shows the network namespaces CNI makes for pods
// created afterwards; and a Deployment's pods placed by kube-scheduler.
func TestClusterRunsDaemonSetsAndDeployments(t *testing.T) {
	testbed.RequireRoot(t)
	nodes.RequireTools(t)
	images := testImages(t)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 1})
	cp := startCluster(t)
	c := nodes.StartForTest(t, bed, cp, images)
	ctx := context.Background()
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "traffic"}}); err != nil {
		t.Fatal(err)
	}

	dsLabels := map[string]string{"app": "hostnet"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "traffic", Name: "hostnet"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: dsLabels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: dsLabels},
				Spec: corev1.PodSpec{
					HostNetwork: true,
					Containers: []corev1.Container{{
						Name: "traffic", Image: images[nodes.TrafficImage].Ref, ImagePullPolicy: corev1.PullNever,
						Args: []string{"serve", "-listen", "127.0.0.1:7000"},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "bpffs", MountPath: "/sys/fs/bpf", MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
							{Name: "netns", MountPath: "/var/run/netns", MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "bpffs", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/sys/fs/bpf", Type: ptr.To(corev1.HostPathDirectory)}}},
						{Name: "netns", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run/netns", Type: ptr.To(corev1.HostPathDirectory)}}},
					},
				},
			},
		},
	}
	if err := cp.Client.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "traffic", Name: "servers"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "servers"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "servers"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "traffic", Image: images[nodes.TrafficImage].Ref, ImagePullPolicy: corev1.PullNever,
					Args: []string{"serve", "-listen", "0.0.0.0:5201"},
				}}},
			},
		},
	}
	if err := cp.Client.Create(ctx, deploy); err != nil {
		t.Fatal(err)
	}

	dsPods := waitRunning(t, cp.Client, "app=hostnet", 2)
	for _, pod := range dsPods {
		n := c.NodeOf(&pod)
		if n == nil {
			t.Fatalf("DaemonSet pod %s on %q, not a bed node", pod.Name, pod.Spec.NodeName)
		}
		pid := containerPID(t, n, &pod)
		if !sameNetNS(fmt.Sprintf("/proc/%d/ns/net", pid), "/var/run/netns/"+n.Bed.NetNS) {
			t.Errorf("hostNetwork pod %s is not in its node's network namespace %s", pod.Name, n.Bed.NetNS)
		}
		// The kubernetes Service address answers in the node's own
		// namespace too: an agent pod's in-cluster client works.
		bp, err := c.AttachPod(context.Background(), &pod)
		if err != nil {
			t.Fatal(err)
		}
		assertPodReachesAPIServer(t, n, &pod, bp)
		probe := inRootOf(pid, "sys", "fs", "bpf", "probe-"+pod.Name)
		if err := os.Mkdir(probe, 0o700); err != nil {
			t.Fatalf("mkdir in pod %s's /sys/fs/bpf: %v", pod.Name, err)
		}
		if _, err := os.Stat(filepath.Join(bed.PinDir(n.Bed), "probe-"+pod.Name)); err != nil {
			t.Errorf("pod %s's /sys/fs/bpf is not the bed's pin directory of %s: %v", pod.Name, n.Name, err)
		}
	}

	servers := waitRunning(t, cp.Client, "app=servers", 2)
	for _, pod := range servers {
		n := c.NodeOf(&pod)
		if n == nil {
			t.Fatalf("Deployment pod %s not placed on a bed node (nodeName %q)", pod.Name, pod.Spec.NodeName)
		}
		// The DaemonSet pod of the same node, started before this pod,
		// sees the pod's network namespace appear under /var/run/netns.
		var ds corev1.Pod
		for _, p := range dsPods {
			if p.Spec.NodeName == pod.Spec.NodeName {
				ds = p
			}
		}
		dsPID := containerPID(t, n, &ds)
		podNet := fmt.Sprintf("/proc/%d/ns/net", containerPID(t, n, &pod))
		entries, _ := os.ReadDir(inRootOf(dsPID, "var", "run", "netns"))
		found := false
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "cni-") && sameNetNS(inRootOf(dsPID, "var", "run", "netns", e.Name()), podNet) {
				found = true
			}
		}
		if !found {
			t.Errorf("the DaemonSet pod on %s does not see pod %s's network namespace under /var/run/netns (entries %v)", n.Name, pod.Name, entries)
		}
	}
	t.Logf("DaemonSet pods on %s and %s; Deployment pods placed by the scheduler on %s and %s",
		dsPods[0].Spec.NodeName, dsPods[1].Spec.NodeName, servers[0].Spec.NodeName, servers[1].Spec.NodeName)
}

// waitRunning waits until want pods match the label selector and run.
func waitRunning(t *testing.T, c client.Client, selector string, want int) []corev1.Pod {
	t.Helper()
	ls, err := labels.Parse(selector)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		var pods corev1.PodList
		if err := c.List(context.Background(), &pods, client.InNamespace("traffic"), client.MatchingLabelsSelector{Selector: ls}); err != nil {
			t.Fatal(err)
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		if running == want && len(pods.Items) == want {
			return pods.Items
		}
		if time.Now().After(deadline) {
			var s []string
			for _, p := range pods.Items {
				var waiting []string
				for _, cs := range p.Status.ContainerStatuses {
					if w := cs.State.Waiting; w != nil {
						waiting = append(waiting, w.Reason+": "+w.Message)
					}
				}
				s = append(s, fmt.Sprintf("%s on %q: %s %v", p.Name, p.Spec.NodeName, p.Status.Phase, waiting))
			}
			t.Fatalf("%s: want %d running pods, have %v", selector, want, s)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// containerPID is a process of the pod's container (not its sandbox's).
func containerPID(t *testing.T, n *nodes.Node, pod *corev1.Pod) int {
	t.Helper()
	// The API may say Running a moment before the process is in the
	// container's cgroup, on a loaded machine.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		for _, pid := range n.PodPIDs(pod) {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "traffic" {
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no traffic process in pod %s", pod.Name)
			return 0
		}
	}
}

// sameNetNS says whether two namespace files (a /proc/PID/ns/net link or a
// bind mount of one) name the same namespace.
func sameNetNS(a, b string) bool {
	var sa, sb syscall.Stat_t
	if syscall.Stat(a, &sa) != nil || syscall.Stat(b, &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// A readiness gate does not hold a workload on a real kubelet; an init
// container running `traffic await` does: it asks the API server, as the
// pod's service account, for its own pod's condition, and the workload
// starts only once the condition (the agent's mptcp.io/ready) is True. This
// is how make demo holds its pods until the agent has configured them.
func TestInitContainerHoldsWorkloadUntilPodCondition(t *testing.T) {
	testbed.RequireRoot(t)
	nodes.RequireTools(t)
	images := testImages(t)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 1})
	cp := startCluster(t)
	c := nodes.StartForTest(t, bed, cp, images)
	ctx := context.Background()
	const gate = "mptcp.io/ready"
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "traffic"}},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: "traffic", Name: "read-own-pod"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: "traffic", Name: "read-own-pod"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "read-own-pod"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "traffic", Name: "default"}},
		},
	}
	for _, o := range objs {
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	field := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	pod := trafficPod("held", c.Node(1).Name, "serve", "-listen", "0.0.0.0:5201")
	pod.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: gate}}
	pod.Spec.InitContainers = []corev1.Container{{
		Name: "await", Image: images[nodes.TrafficImage].Ref, ImagePullPolicy: corev1.PullNever,
		Args: []string{"await", "-condition", gate},
		Env:  []corev1.EnvVar{field("POD_NAME", "metadata.name"), field("POD_NAMESPACE", "metadata.namespace")},
	}}
	if err := cp.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}

	// Held: an address, the init container waiting, no workload.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			t.Fatal(err)
		}
		if pod.Status.PodIP != "" && len(pod.Status.InitContainerStatuses) == 1 && pod.Status.InitContainerStatuses[0].State.Running != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the init container does not run: %+v", pod.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		t.Fatal(err)
	}
	if s := pod.Status.InitContainerStatuses; len(s) != 1 || s[0].State.Running == nil || workloadStarted(pod) {
		log, _ := c.Node(1).ContainerLog(pod, "await", "")
		t.Fatalf("3 s without the condition: want the init container still waiting and no workload, got %+v\nawait log:\n%s", pod.Status, log)
	}

	// The agent's gate, as the agent writes it: a condition merged into the
	// pod's status.
	patch := []byte(`{"status":{"conditions":[{"type":"` + gate + `","status":"True"}]}}`)
	if err := cp.Client.Status().Patch(ctx, pod, client.RawPatch(types.StrategicMergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	set := time.Now()
	waitRunning(t, cp.Client, "", 1)
	log, _ := c.Node(1).ContainerLog(pod, "await", "")
	if !strings.Contains(log, "condition "+gate+" is True") {
		t.Fatalf("await did not see the condition:\n%s", log)
	}
	t.Logf("workload started %s after the condition was set", time.Since(set).Round(100*time.Millisecond))
}

func workloadStarted(pod *corev1.Pod) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Running != nil || cs.State.Terminated != nil {
			return true
		}
	}
	return false
}

// inRootOf is a path inside the root filesystem of process pid (a
// container's), as this namespace reaches it through /proc.
func inRootOf(pid int, elem ...string) string {
	return filepath.Join(append([]string{"/proc", strconv.Itoa(pid), "root"}, elem...)...)
}
