package testbed

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Real nodes (test/testbed/nodes) keep their state outside the bed's scratch directory, under fixed roots named by
// the bed's prefix, so that Sweep finds a crashed run's leftovers from the prefix alone.
const (
	// NodeStateRoot holds NodeStateRoot/<prefix>/node<i>: the private directories of a real node (its
	// containerd's root and state, its kubelet's root directory, its pod logs, CNI configuration and IPAM state).
	NodeStateRoot = "/var/lib/mptcp-testbed"
	// CgroupParent is the cgroup, in every hierarchy, above the real nodes' cgroup roots,
	// CgroupParent/<prefix>/node<i>: the kubelet of node i puts its pods below its own.
	CgroupParent = "/mptcp-testbed"
)

// NodeStateDir is the directory of node's private state when it runs as a real node.
func (b *Bed) NodeStateDir(n *Node) string {
	return filepath.Join(NodeStateRoot, b.Name, fmt.Sprintf("node%d", n.Index))
}

// NodeCgroup is the cgroup root of node's kubelet when it runs as a real node, a path inside every hierarchy.
func (b *Bed) NodeCgroup(n *Node) string {
	return filepath.Join(CgroupParent, b.Name, fmt.Sprintf("node%d", n.Index))
}

// CgroupHierarchies lists where the machine's cgroup hierarchies are mounted: one per cgroup v1 controller (and
// named hierarchy such as name=systemd), and the cgroup v2 one (/sys/fs/cgroup/unified next to v1 controllers,
// /sys/fs/cgroup on a v2-only machine).
func CgroupHierarchies() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if t := fields[sep+1]; (t == "cgroup" || t == "cgroup2") && fields[3] == "/" && !slices.Contains(out, fields[4]) {
			out = append(out, fields[4])
		}
	}
	return out, sc.Err()
}

// MakeCgroup creates cgroup path (absolute inside each hierarchy, "/mptcp-testbed/p/node1") in every hierarchy,
// with its parents. A new cpuset cgroup gets its parent's CPUs and memory nodes (cgroup v1 starts it empty, and an
// empty cpuset cannot hold a process); on cgroup v2, the controllers the parent has are enabled for the children
// of every level it creates.
func MakeCgroup(path string) error {
	hs, err := CgroupHierarchies()
	if err != nil {
		return err
	}
	if len(hs) == 0 {
		return errors.New("no cgroup hierarchy is mounted")
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for _, h := range hs {
		// Another bed's Sweep may remove the shared parent (CgroupParent) when
		// it finds it empty, between two of these mkdirs: start over then.
		var err error
		for range 3 {
			if err = makeCgroupIn(h, parts); !errors.Is(err, fs.ErrNotExist) {
				break
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func makeCgroupIn(hierarchy string, parts []string) error {
	parent := hierarchy
	for _, part := range parts {
		dir := filepath.Join(parent, part)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := inheritCpuset(parent, dir); err != nil {
			return err
		}
		if err := enableControllers(dir); err != nil {
			return err
		}
		parent = dir
	}
	return nil
}

func inheritCpuset(parent, dir string) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		cur, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || strings.TrimSpace(string(cur)) != "" {
			continue // not a v1 cpuset hierarchy, or already set
		}
		v, err := os.ReadFile(filepath.Join(parent, f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dir, f), err)
		}
	}
	return nil
}

// enableControllers turns on, for dir's children, the cgroup v2 controllers dir has. Hierarchies without
// cgroup.subtree_control (v1) are left alone.
func enableControllers(dir string) error {
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return nil
	}
	var want []string
	for _, c := range strings.Fields(string(avail)) {
		want = append(want, "+"+c)
	}
	if len(want) == 0 {
		return nil
	}
	return os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(want, " ")), 0o644)
}

// CgroupPIDs lists the processes in cgroup path and below it, in any hierarchy.
func CgroupPIDs(path string) []int {
	hs, _ := CgroupHierarchies()
	seen := map[int]bool{}
	var pids []int
	for _, h := range hs {
		_ = filepath.WalkDir(filepath.Join(h, path), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] && pid != os.Getpid() {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// RemoveCgroup removes cgroup path and every cgroup below it in every hierarchy, deepest first. A cgroup
// that still holds a process cannot be removed; a dying process may hold one briefly, so removal is retried
// for up to 5 s.
func RemoveCgroup(path string) error {
	hs, err := CgroupHierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		root := filepath.Join(h, path)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			errs = append(errs, rmdirRetry(dirs[i]))
		}
	}
	return errors.Join(errs...)
}

func rmdirRetry(dir string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sweepNodes removes what real nodes of the bed with this prefix leave outside its namespaces: the processes in
// their cgroups (pods' containers, which live in namespaces of their own), the cgroups, and their state
// directories. The parents shared with other beds are removed when they are empty.
func sweepNodes(prefix string) error {
	cg := filepath.Join(CgroupParent, prefix)
	StopPIDs(CgroupPIDs(cg))
	var errs []error
	errs = append(errs, RemoveCgroup(cg))
	if hs, err := CgroupHierarchies(); err == nil {
		for _, h := range hs {
			_ = syscall.Rmdir(filepath.Join(h, CgroupParent)) // fails while another bed uses it
		}
	}
	if err := os.RemoveAll(filepath.Join(NodeStateRoot, prefix)); err != nil {
		errs = append(errs, err)
	}
	_ = syscall.Rmdir(NodeStateRoot)
	return errors.Join(errs...)
}
