package nodes

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// ReadyCondition is the pod condition the agent sets once it has configured
// a pod (internal/agent/kube.PodReadyCondition), which a workload's init
// container waits for.
const ReadyCondition = "mptcp.io/ready"

// WorkloadContainer is the name of a traffic pod's workload container.
const WorkloadContainer = "traffic"

// TrafficPod is a Pod on node that runs the traffic image (image) with args,
// held until the agent has configured it: it has the agent's readiness gate
// and an init container, `traffic await`, that waits for the condition, as
// a real kubelet starts containers at once and a gate alone would only keep
// the pod out of Ready (docs/testbed.md, "What a real kubelet cannot do
// here"). The namespace's default service account must be allowed to read
// its pods (AllowAwait).
func TrafficPod(namespace, name, node, image string, labels map[string]string, env []corev1.EnvVar, args ...string) *corev1.Pod {
	field := func(env, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: env, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:       node,
			RestartPolicy:  corev1.RestartPolicyNever,
			ReadinessGates: []corev1.PodReadinessGate{{ConditionType: ReadyCondition}},
			InitContainers: []corev1.Container{{
				Name: "await-agent", Image: image, ImagePullPolicy: corev1.PullNever,
				Args: []string{"await", "-condition", ReadyCondition},
				Env:  []corev1.EnvVar{field("POD_NAME", "metadata.name"), field("POD_NAMESPACE", "metadata.namespace")},
			}},
			Containers: []corev1.Container{{
				Name: WorkloadContainer, Image: image, ImagePullPolicy: corev1.PullNever,
				Args: args, Env: env,
			}},
		},
	}
}

// PodIPEnv is the pod's own address, from the downward API, as $(POD_IP).
var PodIPEnv = corev1.EnvVar{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}

// AllowAwait lets the pods of namespace read pods (their own, for
// `traffic await`), as their default service account.
func AllowAwait(ctx context.Context, c client.Client, namespace string) error {
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "read-own-pod", Namespace: namespace},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "read-own-pod", Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "default", Namespace: namespace}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// WaitStarted waits until the pod's workload container runs (or has already
// ended), which needs the agent to have set the pod's condition. On
// timeout the error says what the pod is waiting for.
func WaitStarted(ctx context.Context, c client.Client, pod *corev1.Pod, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Name == WorkloadContainer && (cs.State.Running != nil || cs.State.Terminated != nil) {
				return nil
			}
		}
		if time.Now().After(deadline) || pod.Status.Phase == corev1.PodFailed {
			return fmt.Errorf("pod %s/%s not started after %v: phase %q, IP %q, conditions %s (the agent sets %s once it configured the pod)",
				pod.Namespace, pod.Name, timeout, pod.Status.Phase, pod.Status.PodIP, conditions(pod), ReadyCondition)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitEnded waits until the pod has run to its end: nil when it succeeded;
// the workload's log otherwise.
func (c *Cluster) WaitEnded(ctx context.Context, cl client.Client, pod *corev1.Pod) error {
	for {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		switch pod.Status.Phase {
		case corev1.PodSucceeded:
			return nil
		case corev1.PodFailed:
			log, _ := c.NodeOf(pod).ContainerLog(pod, WorkloadContainer, "")
			return fmt.Errorf("pod %s/%s failed: %s", pod.Namespace, pod.Name, log)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WorkloadLog is what the pod's workload container wrote to stream so far.
func (c *Cluster) WorkloadLog(pod *corev1.Pod, stream string) string {
	n := c.NodeOf(pod)
	if n == nil {
		return ""
	}
	out, _ := n.ContainerLog(pod, WorkloadContainer, stream)
	return out
}

// ServerReports waits until a `traffic serve` pod has reported n
// connections on its stdout, and returns them.
func (c *Cluster) ServerReports(ctx context.Context, server *corev1.Pod, n int, timeout time.Duration) ([]testbed.ServerReport, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		got := JSONLines[testbed.ServerReport](c.WorkloadLog(server, "stdout"))
		if len(got) >= n {
			return got, nil
		}
		select {
		case <-ctx.Done():
			return got, fmt.Errorf("server pod %s reported %d of %d connections: %w", server.Name, len(got), n, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// SenderReports are the connection reports a `traffic send -json` pod
// printed on its stdout.
func (c *Cluster) SenderReports(client *corev1.Pod) ([]testbed.SenderReport, error) {
	out := c.WorkloadLog(client, "stdout")
	reps := JSONLines[testbed.SenderReport](out)
	if len(reps) == 0 {
		return nil, fmt.Errorf("the client pod %s printed no connection report: %q", client.Name, out)
	}
	return reps, nil
}

// WaitListening waits until a `traffic serve` pod says it listens.
func (c *Cluster) WaitListening(ctx context.Context, server *corev1.Pod, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !strings.Contains(c.WorkloadLog(server, "stderr"), "listening on") {
		if time.Now().After(deadline) {
			return fmt.Errorf("server pod %s does not listen after %v: %s", server.Name, timeout, c.WorkloadLog(server, ""))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// JSONLines decodes the lines of out that are T in JSON, skipping others.
func JSONLines[T any](out string) []T {
	var got []T
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err == nil {
			got = append(got, v)
		}
	}
	return got
}

func conditions(p *corev1.Pod) string {
	var s []string
	for _, c := range p.Status.Conditions {
		s = append(s, fmt.Sprintf("%s=%s", c.Type, c.Status))
	}
	return "[" + strings.Join(s, " ") + "]"
}
