package nodes_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed/nodes"
)

// nodeFootprint is what a real node leaves on the machine while it runs,
// recorded to be checked after teardown.
type nodeFootprint struct {
	pids    []int  // containerd, kubelet and the pods' processes
	mountNS string // "mnt:[N]"
}

// footprint records the processes and mount namespace of every node.
func footprint(c *nodes.Cluster) []nodeFootprint {
	var out []nodeFootprint
	for _, n := range c.Nodes {
		f := nodeFootprint{pids: append([]int{n.Containerd.PID, n.Kubelet.PID}, testbed.CgroupPIDs(n.Cgroup)...)}
		f.mountNS, _ = os.Readlink(n.MountNS())
		out = append(out, f)
	}
	return out
}

// assertNothingLeft checks, once the nodes, the bed and the control plane are
// gone, that the machine holds nothing of them: no process they ran, no
// process in a node's mount namespace (so the namespace and every mount in
// it are gone), no cgroup, state directory, pin directory or namespace of the
// bed, and no mount naming the bed in the machine's mount table.
func assertNothingLeft(t *testing.T, bed *testbed.Bed, before []nodeFootprint) {
	t.Helper()
	for _, f := range before {
		for _, pid := range f.pids {
			if _, err := os.Stat(filepath.Join("/proc", itoa(pid))); err == nil && !zombie(pid) {
				t.Errorf("process %d still runs", pid)
			}
		}
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "mnt")); err == nil && l == f.mountNS {
				t.Errorf("process %s is still in a node's mount namespace %s", e.Name(), l)
			}
		}
	}
	hs, err := testbed.CgroupHierarchies()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h, testbed.CgroupParent, bed.Name)); err == nil {
			t.Errorf("cgroup %s left in %s", filepath.Join(testbed.CgroupParent, bed.Name), h)
		}
	}
	for _, d := range []string{filepath.Join(testbed.NodeStateRoot, bed.Name), filepath.Join(testbed.PinRoot, bed.Name)} {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s left", d)
		}
	}
	netns, _ := os.ReadDir("/var/run/netns")
	for _, e := range netns {
		if strings.HasPrefix(e.Name(), bed.Name+"-") {
			t.Errorf("namespace %s left", e.Name())
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, bed.Name) {
			t.Errorf("mount left: %s", line)
		}
	}
}

func zombie(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", itoa(pid), "stat"))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

func itoa(i int) string { return strconv.Itoa(i) }
