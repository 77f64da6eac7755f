package kubelet

import (
	"context"
	"fmt"
	"maps"
	"runtime"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
)

// register creates (or updates) the Node of bed node n and marks it Ready.
// Its addresses are the node's NIC addresses, its pod CIDR the bed's; nothing
// renews a lease because no node lifecycle controller runs in the test
// control plane to notice.
func (k *Kubelet) register(ctx context.Context, c client.Client, n *testbed.Node) error {
	name := k.names[n]
	labels := map[string]string{
		corev1.LabelHostname: name,
		corev1.LabelOSStable: "linux",
		LabelMultipath:       "true",
	}
	maps.Copy(labels, k.opts.NodeLabels)
	node := &corev1.Node{}
	err := c.Get(ctx, client.ObjectKey{Name: name}, node)
	switch {
	case apierrors.IsNotFound(err):
		node = &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       corev1.NodeSpec{PodCIDR: n.PodCIDR.String(), PodCIDRs: []string{n.PodCIDR.String()}},
		}
		if err := c.Create(ctx, node); err != nil {
			return fmt.Errorf("kubelet: register node %s: %w", name, err)
		}
	case err != nil:
		return fmt.Errorf("kubelet: node %s: %w", name, err)
	default:
		if node.Labels == nil {
			node.Labels = map[string]string{}
		}
		maps.Copy(node.Labels, labels)
		if err := c.Update(ctx, node); err != nil {
			return fmt.Errorf("kubelet: update node %s: %w", name, err)
		}
	}

	orig := node.DeepCopy()
	addrs := []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}}
	for _, nic := range n.NICs {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: nic.Addr.Addr().String()})
	}
	pods := *resource.NewQuantity(int64(len(n.Pods)), resource.DecimalSI)
	now := metav1.Now()
	node.Status = corev1.NodeStatus{
		Addresses:   addrs,
		Capacity:    corev1.ResourceList{corev1.ResourcePods: pods},
		Allocatable: corev1.ResourceList{corev1.ResourcePods: pods},
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "test bed kubelet stand-in", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		NodeInfo: corev1.NodeSystemInfo{OperatingSystem: "linux", Architecture: runtime.GOARCH, KubeletVersion: "testbed"},
	}
	if err := c.Status().Patch(ctx, node, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("kubelet: node %s status: %w", name, err)
	}
	k.log.Info("registered node", "node", name, "netns", n.NetNS, "podCIDR", n.PodCIDR)
	return nil
}
