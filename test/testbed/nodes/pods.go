package nodes

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// NodeOf returns the real node a Pod is bound to, or nil.
func (c *Cluster) NodeOf(pod *corev1.Pod) *Node {
	for _, n := range c.Nodes {
		if n.Name == pod.Spec.NodeName {
			return n
		}
	}
	return nil
}

// ContainerLog returns what a container of the pod wrote to stream ("stdout",
// "stderr", or "" for both), across its restarts, read from the files the
// kubelet keeps under the node's /var/log/pods: what kubectl logs shows,
// without a round trip through the API server, and still there after the
// pod is deleted until the node stops.
func (n *Node) ContainerLog(pod *corev1.Pod, container, stream string) (string, error) {
	dir := n.layout.private(filepath.Join("/var/log/pods", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), container))
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", fmt.Errorf("no log of container %s of pod %s/%s in %s", container, pod.Namespace, pod.Name, dir)
	}
	sort.Strings(files)
	var out strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		criLog(&out, data, stream)
	}
	return out.String(), nil
}

// criLog appends the content of CRI log lines ("TIME STREAM TAG CONTENT",
// TAG F for a full line, P for a part of a longer one) of stream to out.
func criLog(out *strings.Builder, data []byte, stream string) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 4)
		if len(f) < 3 || (stream != "" && f[1] != stream) {
			continue
		}
		if len(f) == 4 {
			out.WriteString(f[3])
		}
		if f[2] == "F" {
			out.WriteByte('\n')
		}
	}
}

// PodPIDs lists the processes of a pod (its sandbox's and its containers'),
// found in the pod's cgroup below the node's cgroup root.
func (n *Node) PodPIDs(pod *corev1.Pod) []int {
	hs, _ := testbed.CgroupHierarchies()
	want := "pod" + string(pod.UID)
	for _, h := range hs {
		var dir string
		_ = filepath.WalkDir(filepath.Join(h, n.Cgroup), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && d.Name() == want {
				dir = p
				return filepath.SkipAll
			}
			return nil
		})
		if dir != "" {
			rel, _ := filepath.Rel(h, dir)
			return testbed.CgroupPIDs("/" + rel)
		}
	}
	return nil
}

// AttachPod names the pod's network namespace in the machine's /var/run/netns
// (ip netns attach) and returns the pod as a bed pod: bed.Command and the
// bed's traffic helpers then work in it, e.g. to configure MPTCP endpoints
// as the agent would. The name, <bed>-pod-<namespace>-<name>, has the bed's
// prefix, so the bed's Down removes it. CNI's own file for the namespace
// lives in the node's mount namespace only (docs/testbed.md, "Real nodes").
func (c *Cluster) AttachPod(ctx context.Context, pod *corev1.Pod) (*testbed.Pod, error) {
	n := c.NodeOf(pod)
	if n == nil {
		return nil, fmt.Errorf("pod %s/%s is not on a real node of the bed", pod.Namespace, pod.Name)
	}
	addr, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s has no IP yet: %w", pod.Namespace, pod.Name, err)
	}
	pids := n.PodPIDs(pod)
	if len(pids) == 0 {
		return nil, fmt.Errorf("pod %s/%s has no process in %s", pod.Namespace, pod.Name, n.Cgroup)
	}
	name := fmt.Sprintf("%s-pod-%s-%s", c.opts.Bed.Name, pod.Namespace, pod.Name)
	if out, err := exec.CommandContext(ctx, "ip", "netns", "attach", name, fmt.Sprint(pids[0])).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns attach %s: %w: %s", name, err, out)
	}
	// The host end of the pod's veth is where the node routes the pod's
	// address.
	out, err := exec.CommandContext(ctx, "ip", "-n", n.Bed.NetNS, "-o", "route", "get", addr.String()).Output()
	if err != nil {
		return nil, fmt.Errorf("route to %s on %s: %w", addr, n.Name, err)
	}
	hostIf := ""
	if f := strings.Fields(string(out)); len(f) > 0 {
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "dev" {
				hostIf = f[i+1]
			}
		}
	}
	return &testbed.Pod{Name: pod.Name, NetNS: name, Addr: addr, HostIf: hostIf, Node: n.Bed}, nil
}
