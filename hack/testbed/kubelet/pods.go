package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
)

func logrFrom(l *slog.Logger) logr.Logger { return logr.FromSlogHandler(l.Handler()) }

func controllerOptions() controller.Options { return controller.Options{MaxConcurrentReconciles: 1} }

// maxGrace bounds how long a deleted pod's workload gets between SIGTERM and
// SIGKILL, whatever the pod asks: tests should not wait 30 s.
const maxGrace = 5 * time.Second

// Reconcile moves one pod of the stand-in's nodes towards its spec: bind,
// give it a bed slot and its IP, start its workload once its readiness gates
// are True, report exits, and stop and remove it once deleted.
func (k *Kubelet) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pod := &corev1.Pod{}
	if err := k.c.Get(ctx, req.NamespacedName, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, k.release(req.NamespacedName, "")
		}
		return reconcile.Result{}, err
	}
	// The same name with another UID: the pod we ran is gone.
	if err := k.release(req.NamespacedName, pod.UID); err != nil {
		return reconcile.Result{}, err
	}
	if pod.Spec.NodeName == "" {
		return reconcile.Result{}, k.bind(ctx, pod)
	}
	node := k.nodes[pod.Spec.NodeName]
	if node == nil {
		return reconcile.Result{}, nil
	}
	if pod.DeletionTimestamp != nil {
		return reconcile.Result{}, k.remove(ctx, pod)
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return reconcile.Result{}, nil
	}
	if pod.Spec.HostNetwork {
		return reconcile.Result{}, k.fail(ctx, pod, "HostNetworkUnsupported", "the test bed's kubelet stand-in runs only pods with their own network namespace")
	}

	st, err := k.admit(ctx, pod, node)
	if err != nil || st == nil {
		// No free slot: a deleted pod frees one and enqueues nothing
		// for this pod, so look again later.
		return reconcile.Result{RequeueAfter: time.Second}, err
	}
	if err := k.markRunning(ctx, pod, st); err != nil {
		return reconcile.Result{}, err
	}
	if !gatesTrue(pod) {
		// The gate's condition is written on the pod, which enqueues it.
		return reconcile.Result{}, nil
	}
	k.mu.Lock()
	started, exited, code := st.procs != nil, st.exited, st.code
	k.mu.Unlock()
	if !started {
		return reconcile.Result{}, k.startWorkload(ctx, pod, st)
	}
	if exited {
		return reconcile.Result{}, k.markExited(ctx, pod, code)
	}
	return reconcile.Result{}, nil
}

// bind gives a pending pod the node its nodeSelector names by
// kubernetes.io/hostname, when that node is one of ours: the whole of the
// stand-in's scheduler. Other pods are left to whoever schedules them.
func (k *Kubelet) bind(ctx context.Context, pod *corev1.Pod) error {
	name := pod.Spec.NodeSelector[corev1.LabelHostname]
	if k.nodes[name] == nil {
		return nil
	}
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: name},
	}
	if err := k.c.SubResource("binding").Create(ctx, pod, b); err != nil {
		return fmt.Errorf("bind %s/%s to %s: %w", pod.Namespace, pod.Name, name, err)
	}
	k.log.Info("bound pod", "pod", client.ObjectKeyFromObject(pod), "node", name)
	return nil
}

// admit returns the pod's state, giving it a free bed pod of its node and
// recording the slot on the pod; nil when the node has no free slot.
func (k *Kubelet) admit(ctx context.Context, pod *corev1.Pod, node *testbed.Node) (*podState, error) {
	key := client.ObjectKeyFromObject(pod)
	k.mu.Lock()
	st := k.pods[key]
	if st == nil {
		for _, slot := range node.Pods {
			if _, used := k.slots[slot]; !used {
				st = &podState{uid: pod.UID, slot: slot}
				k.pods[key], k.slots[slot] = st, key
				break
			}
		}
	}
	k.mu.Unlock()
	if st == nil {
		msg := fmt.Sprintf("node %s has no free bed pod (it has %d)", pod.Spec.NodeName, len(node.Pods))
		k.log.Info("pod waits for a slot", "pod", key, "reason", msg)
		return nil, k.setCondition(ctx, pod, corev1.PodScheduled, corev1.ConditionFalse, "NoFreeSlot", msg)
	}
	want := map[string]string{
		AnnotationNetNS:         "/var/run/netns/" + st.slot.NetNS,
		AnnotationHostInterface: st.slot.HostIf,
		AnnotationSlot:          st.slot.Name,
	}
	orig := pod.DeepCopy()
	changed := false
	for a, v := range want {
		if pod.Annotations[a] != v {
			if pod.Annotations == nil {
				pod.Annotations = map[string]string{}
			}
			pod.Annotations[a], changed = v, true
		}
	}
	if changed {
		if err := k.c.Patch(ctx, pod, client.MergeFrom(orig)); err != nil {
			return nil, fmt.Errorf("record the slot of %s: %w", key, err)
		}
		k.log.Info("admitted pod", "pod", key, "slot", st.slot.Name, "netns", st.slot.NetNS, "ip", st.slot.Addr)
	}
	return st, nil
}

// markRunning sets the status a kubelet sets once the sandbox exists: phase
// Running with the slot's address. Ready stays False until the workload runs.
func (k *Kubelet) markRunning(ctx context.Context, pod *corev1.Pod, st *podState) error {
	ip := st.slot.Addr.String()
	if pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP == ip {
		return nil
	}
	orig := pod.DeepCopy()
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = ip
	pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	pod.Status.HostIP = st.slot.Node.NICs[0].Addr.Addr().String()
	pod.Status.HostIPs = []corev1.HostIP{{IP: pod.Status.HostIP}}
	pod.Status.StartTime = &now
	setCond(pod, corev1.PodScheduled, corev1.ConditionTrue, "", "")
	setCond(pod, corev1.PodInitialized, corev1.ConditionTrue, "", "")
	setCond(pod, corev1.ContainersReady, corev1.ConditionFalse, "ContainersNotStarted", "waiting for the readiness gates")
	setCond(pod, corev1.PodReady, corev1.ConditionFalse, "ContainersNotStarted", "waiting for the readiness gates")
	pod.Status.ContainerStatuses = containerStatuses(pod, func(corev1.Container) corev1.ContainerState {
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ReadinessGatesPending"}}
	}, false)
	return k.patchStatus(ctx, pod, orig)
}

// gatesTrue says whether every readiness-gate condition of the pod is True:
// the stand-in holds the workload until then, as an init container waiting
// for the agent would.
func gatesTrue(pod *corev1.Pod) bool {
	for _, g := range pod.Spec.ReadinessGates {
		ok := false
		for _, c := range pod.Status.Conditions {
			if c.Type == g.ConditionType && c.Status == corev1.ConditionTrue {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// startWorkload starts every container's command in the pod's namespace.
func (k *Kubelet) startWorkload(ctx context.Context, pod *corev1.Pod, st *podState) error {
	key := client.ObjectKeyFromObject(pod)
	var argvs [][]string
	for i := range pod.Spec.Containers {
		argv, err := command(ctx, k.c, pod, &pod.Spec.Containers[i])
		if err != nil {
			return k.fail(ctx, pod, "CreateContainerConfigError", err.Error())
		}
		argvs = append(argvs, argv)
	}
	var procs []*testbed.Process
	for _, argv := range argvs {
		p, err := k.opts.Bed.Start(st.slot.NetNS, argv...)
		if err != nil {
			_ = stopProcs(procs, time.Second)
			return fmt.Errorf("start %s: %w", key, err)
		}
		procs = append(procs, p)
	}
	k.mu.Lock()
	st.procs = procs
	k.mu.Unlock()
	go k.watchExit(pod, st)
	k.log.Info("started workload", "pod", key, "slot", st.slot.Name, "containers", len(procs))

	orig := pod.DeepCopy()
	setCond(pod, corev1.ContainersReady, corev1.ConditionTrue, "", "")
	setCond(pod, corev1.PodReady, corev1.ConditionTrue, "", "")
	now := metav1.Now()
	pod.Status.ContainerStatuses = containerStatuses(pod, func(corev1.Container) corev1.ContainerState {
		return corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
	}, true)
	return k.patchStatus(ctx, pod, orig)
}

// watchExit records when every process of the pod has exited and enqueues
// the pod, which then reports the exit.
func (k *Kubelet) watchExit(pod *corev1.Pod, st *podState) {
	code := 0
	for _, p := range st.procs {
		err := p.Wait(context.Background())
		var ee *exec.ExitError
		if errors.As(err, &ee) && code == 0 {
			code = ee.ExitCode()
		}
	}
	k.mu.Lock()
	st.exited, st.code = true, code
	k.mu.Unlock()
	k.exits <- event.GenericEvent{Object: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}}}
}

// markExited reports a workload that ended by itself: Succeeded on exit 0,
// Failed otherwise (restartPolicy is not honoured: nothing restarts).
func (k *Kubelet) markExited(ctx context.Context, pod *corev1.Pod, code int) error {
	orig := pod.DeepCopy()
	pod.Status.Phase = corev1.PodSucceeded
	if code != 0 {
		pod.Status.Phase = corev1.PodFailed
	}
	setCond(pod, corev1.ContainersReady, corev1.ConditionFalse, "PodCompleted", "")
	setCond(pod, corev1.PodReady, corev1.ConditionFalse, "PodCompleted", "")
	now := metav1.Now()
	pod.Status.ContainerStatuses = containerStatuses(pod, func(corev1.Container) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), FinishedAt: now}}
	}, false)
	k.log.Info("workload exited", "pod", client.ObjectKeyFromObject(pod), "code", code)
	return k.patchStatus(ctx, pod, orig)
}

// fail reports a pod the stand-in cannot run, with the reason a user can act on.
func (k *Kubelet) fail(ctx context.Context, pod *corev1.Pod, reason, msg string) error {
	orig := pod.DeepCopy()
	pod.Status.Phase = corev1.PodFailed
	pod.Status.Reason, pod.Status.Message = reason, msg
	k.log.Info("pod failed", "pod", client.ObjectKeyFromObject(pod), "reason", reason, "message", msg)
	return k.patchStatus(ctx, pod, orig)
}

// remove finishes a graceful deletion as a kubelet does: stop the workload,
// free the slot, then delete the pod with grace 0 (this very pod, by UID).
func (k *Kubelet) remove(ctx context.Context, pod *corev1.Pod) error {
	grace := maxGrace
	if g := pod.DeletionGracePeriodSeconds; g != nil && time.Duration(*g)*time.Second < grace {
		grace = time.Duration(*g) * time.Second
	}
	if err := k.stop(client.ObjectKeyFromObject(pod), grace); err != nil {
		return err
	}
	err := k.c.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	k.log.Info("removed pod", "pod", client.ObjectKeyFromObject(pod))
	return nil
}

// release stops and forgets what runs for key unless it is the pod with uid
// keep ("" forgets whatever runs).
func (k *Kubelet) release(key types.NamespacedName, keep types.UID) error {
	k.mu.Lock()
	st := k.pods[key]
	k.mu.Unlock()
	if st == nil || (keep != "" && st.uid == keep) {
		return nil
	}
	return k.stop(key, maxGrace)
}

// stop ends the pod's processes by PID and frees its slot.
func (k *Kubelet) stop(key types.NamespacedName, grace time.Duration) error {
	k.mu.Lock()
	st := k.pods[key]
	k.mu.Unlock()
	if st == nil {
		return nil
	}
	if err := stopProcs(st.procs, grace); err != nil {
		return err
	}
	k.mu.Lock()
	delete(k.pods, key)
	delete(k.slots, st.slot)
	k.mu.Unlock()
	k.log.Info("stopped pod", "pod", key, "slot", st.slot.Name)
	return nil
}

func (k *Kubelet) setCondition(ctx context.Context, pod *corev1.Pod, t corev1.PodConditionType, s corev1.ConditionStatus, reason, msg string) error {
	orig := pod.DeepCopy()
	setCond(pod, t, s, reason, msg)
	return k.patchStatus(ctx, pod, orig)
}

// patchStatus sends only what changed as a strategic merge patch, so that
// conditions other writers own (the agent's readiness gate) are kept.
func (k *Kubelet) patchStatus(ctx context.Context, pod, orig *corev1.Pod) error {
	if err := k.c.Status().Patch(ctx, pod, client.StrategicMergeFrom(orig)); err != nil {
		return fmt.Errorf("status of %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

func setCond(pod *corev1.Pod, t corev1.PodConditionType, s corev1.ConditionStatus, reason, msg string) {
	for i := range pod.Status.Conditions {
		c := &pod.Status.Conditions[i]
		if c.Type != t {
			continue
		}
		if c.Status != s {
			c.LastTransitionTime = metav1.Now()
		}
		c.Status, c.Reason, c.Message = s, reason, msg
		return
	}
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{
		Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: metav1.Now(),
	})
}

func containerStatuses(pod *corev1.Pod, state func(corev1.Container) corev1.ContainerState, ready bool) []corev1.ContainerStatus {
	var out []corev1.ContainerStatus
	for _, c := range pod.Spec.Containers {
		out = append(out, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, State: state(c), Ready: ready, Started: ptrBool(ready),
		})
	}
	return out
}

func ptrBool(b bool) *bool { return &b }

var _ reconcile.Reconciler = (*Kubelet)(nil)
