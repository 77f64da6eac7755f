package nodes_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
)

// nodeFootprint is what a real node runs on the machine, recorded to be
// checked after teardown: processes by PID and start time (a PID may be
// given to another process meanwhile).
type nodeFootprint struct {
	procs []procID // containerd, kubelet, shims, the pods' processes
}

type procID struct {
	pid   int
	start string // field 22 of /proc/PID/stat, in clock ticks since boot
}

// footprint records the processes of every node: its containerd and
// kubelet, what its cgroups hold (the pods) and what its mount namespace
// holds (the shims), while the nodes run.
func footprint(c *nodes.Cluster) []nodeFootprint {
	var out []nodeFootprint
	for _, n := range c.Nodes {
		pids := append([]int{n.Containerd.PID, n.Kubelet.PID}, testbed.CgroupPIDs(n.Cgroup)...)
		if ns, err := os.Readlink(n.MountNS()); err == nil {
			pids = append(pids, nodes.PIDsInMountNS(ns)...)
		}
		var f nodeFootprint
		for _, pid := range pids {
			if st := startTime(pid); st != "" {
				f.procs = append(f.procs, procID{pid, st})
			}
		}
		out = append(out, f)
	}
	return out
}

func startTime(pid int) string {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	// pid (comm) state ...: comm may hold spaces, the fields follow the last ')'.
	i := strings.LastIndexByte(string(stat), ')')
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 20 || f[0] == "Z" {
		return ""
	}
	return f[19] // field 22 overall: starttime
}

// assertNothingLeft checks, once the nodes, the bed and the control plane are
// gone, that the machine holds nothing of them: no process they ran (so no
// mount namespace of a node either: only they were in it), no cgroup, state
// directory, pin directory or namespace of the bed, and no mount naming the
// bed in the machine's mount table.
func assertNothingLeft(t *testing.T, bed *testbed.Bed, before []nodeFootprint) {
	t.Helper()
	for _, f := range before {
		for _, p := range f.procs {
			if startTime(p.pid) == p.start {
				t.Errorf("process %d still runs", p.pid)
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
