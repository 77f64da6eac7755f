package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// PinRoot holds one directory per bed, PinRoot/<prefix>/node<i>.
	PinRoot = "/sys/fs/bpf/mptcp-testbed"
	// stateDir records which process owns which bed prefix.
	stateDir = "/run/mptcp-testbed/owners"
)

// PinDir is the bpffs directory where node's agent pins its objects. It is created on first use and removed by
// Down and Sweep.
func (b *Bed) PinDir(node *Node) string {
	d := filepath.Join(PinRoot, b.Name, fmt.Sprintf("node%d", node.Index))
	if err := ensureBPFFS(); err == nil {
		_ = os.MkdirAll(d, 0o700)
	}
	return d
}

// ensureBPFFS mounts bpffs at /sys/fs/bpf when nothing is mounted there (a fresh machine), and makes the alias
// mount that Command uses to show it inside "ip netns exec". Both stay mounted: other beds and agents may use them.
func ensureBPFFS() error {
	if !isBPFFS("/sys/fs/bpf") {
		if err := os.MkdirAll("/sys/fs/bpf", 0o755); err != nil {
			return err
		}
		if err := unix.Mount("bpffs", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("mount bpffs at /sys/fs/bpf: %w", err)
		}
	}
	if !isBPFFS(bpffsAlias) {
		if err := os.MkdirAll(bpffsAlias, 0o700); err != nil {
			return err
		}
		if err := unix.Mount("/sys/fs/bpf", bpffsAlias, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /sys/fs/bpf at %s: %w", bpffsAlias, err)
		}
	}
	return nil
}

func isBPFFS(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && uint32(st.Type) == unix.BPF_FS_MAGIC
}

// Sweep removes everything of the bed with this prefix: it kills the processes inside its namespaces (by PID, as
// "ip netns pids" lists them) and in its real nodes' cgroups, removes those cgroups and the nodes' state
// directories, deletes the namespaces and removes its pin directory. It is what Down does after
// stopping its own processes, and what a test runs to clear a crashed run's leftovers.
func Sweep(prefix string) error {
	if prefix == "" || strings.ContainsAny(prefix, "/ ") {
		return fmt.Errorf("refusing to sweep prefix %q", prefix)
	}
	names, err := listNetns()
	if err != nil {
		return err
	}
	var mine []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix+"-") {
			mine = append(mine, n)
		}
	}
	var errs []error
	killInNetns(mine)
	if err := sweepNodes(prefix); err != nil {
		errs = append(errs, err)
	}
	for _, n := range mine {
		if err := run(context.Background(), "ip", "netns", "del", n); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(filepath.Join(PinRoot, prefix)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	os.Remove(filepath.Join(stateDir, prefix+".owner"))
	return errors.Join(errs...)
}

// defaultName matches the prefixes NewName makes.
var defaultName = regexp.MustCompile(`^(mpt[0-9a-f]{6})-`)

// SweepStale removes the beds whose owning process is gone (a crashed or killed test run), namespaces with a
// default-style prefix that no process claims, and real nodes' state directories that no live bed claims. Beds of live processes, such as a concurrent test run, are kept.
func SweepStale() error {
	// What exists first, then who owns it: a bed claims its prefix before it
	// makes anything (Up), so whatever is listed here was claimed before the
	// owners are read below. The other order would take a bed that a
	// concurrent test is bringing up for a stale one, and delete its
	// namespaces while they are being made.
	names, err := listNetns()
	if err != nil {
		return err
	}
	dirs, _ := os.ReadDir(NodeStateRoot)
	stale := map[string]bool{}
	owned := map[string]bool{}
	entries, _ := os.ReadDir(stateDir)
	for _, e := range entries {
		prefix, ok := strings.CutSuffix(e.Name(), ".owner")
		if !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(stateDir, e.Name()))
		pid, perr := strconv.Atoi(strings.TrimSpace(string(data)))
		if err == nil && perr == nil && alive(pid) {
			owned[prefix] = true
		} else {
			stale[prefix] = true
		}
	}
	for _, n := range names {
		if m := defaultName.FindStringSubmatch(n); m != nil && !owned[m[1]] {
			stale[m[1]] = true
		}
	}
	// Real nodes' state of a bed whose namespaces are already gone.
	for _, d := range dirs {
		if !owned[d.Name()] {
			stale[d.Name()] = true
		}
	}
	errs := []error{narrowStaleCC()}
	for prefix := range stale {
		errs = append(errs, Sweep(prefix))
	}
	return errors.Join(errs...)
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func listNetns() ([]string, error) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return nil, fmt.Errorf("ip netns list: %w", err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// netnsPIDs lists the processes whose network namespace is ns.
func netnsPIDs(ns string) []int {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killInNetns stops every process inside the namespaces: SIGTERM, up to 2 s of grace, then SIGKILL.
func killInNetns(namespaces []string) {
	var pids []int
	for _, ns := range namespaces {
		pids = append(pids, netnsPIDs(ns)...)
	}
	StopPIDs(pids)
}

// StopPIDs stops the processes: SIGTERM, up to 2 s of grace, then SIGKILL, and waits up to 5 s more for them
// to exit. A zombie counts as exited: it holds no namespace, cgroup or mount any more.
func StopPIDs(pids []int) {
	if len(pids) == 0 {
		return
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	if waitExited(pids, 2*time.Second) {
		return
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	waitExited(pids, 5*time.Second)
}

// waitExited waits until every process has exited or become a zombie, at most d; it says whether they all did.
func waitExited(pids []int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		left := false
		for _, pid := range pids {
			if alive(pid) && !zombie(pid) {
				left = true
			}
		}
		if !left {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// zombie says whether pid has exited and waits for its parent to reap it.
func zombie(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses, the state follows the last ')'.
	i := strings.LastIndexByte(string(stat), ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}
