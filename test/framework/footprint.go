package framework

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// A Footprint is what an agent can change on a node and in the network
// namespaces of its pods, read as text item by item ("node1 ip -4 rule",
// "pod apps/web sysctl net"), so that the state before an install and after
// the uninstall can be compared line by line. It is read from outside the
// agent with the distribution's tools and the kernel's own lists, never
// through the agent's code: routing rules and every table's routes, qdiscs
// and classic TC filters, TCX programs on every interface, every net.*
// sysctl of the node and of each pod, each pod's MPTCP endpoints and limits,
// and the files under the node's bpffs and the agent's state directory.
type Footprint map[string]string

// FootprintPaths are the node's directories whose contents count, as the
// machine sees them: its bpffs (bed.PinDir) and the agent's state root.
type FootprintPaths struct {
	BPFFS, State string
}

// volatileSysctls are net.* sysctls whose values move on their own (counts
// of things alive, random per-boot keys): not settings anyone changed.
var volatileSysctls = regexp.MustCompile(`^net\.(netfilter\.nf_conntrack_count|ipv4\.tcp_fastopen_key|core\.bpf_jit_.*) =`)

// TakeFootprint reads node's footprint and that of pods.
func TakeFootprint(b *testbed.Bed, node *testbed.Node, paths FootprintPaths, pods []*testbed.Pod) (Footprint, error) {
	f := Footprint{}
	var errs []error
	node1 := fmt.Sprintf("node%d ", node.Index)
	cmd := func(key, ns string, args ...string) string {
		out, err := b.Command(ns, args...).CombinedOutput()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w: %s", ns, strings.Join(args, " "), err, out))
		}
		f[key] = string(out)
		return string(out)
	}
	for _, fam := range []string{"-4", "-6"} {
		cmd(node1+"ip "+fam+" rule", node.NetNS, "ip", fam, "rule", "show")
		cmd(node1+"ip "+fam+" route", node.NetNS, "ip", fam, "route", "show", "table", "all")
	}
	links := cmd(node1+"links", node.NetNS, "sh", "-c", "ip -o link show | cut -d: -f2 | cut -d@ -f1")
	cmd(node1+"tc qdisc", node.NetNS, "tc", "qdisc", "show")
	for _, l := range strings.Fields(links) {
		for _, dir := range []string{"ingress", "egress"} {
			cmd(node1+"tc filter "+l+" "+dir, node.NetNS, "tc", "filter", "show", "dev", l, dir)
		}
		progs, err := tcxPrograms(node, l)
		if err != nil {
			errs = append(errs, err)
		}
		f[node1+"tcx "+l] = progs
	}
	f[node1+"sysctl net"] = sysctls(cmd(node1+"sysctl net", node.NetNS, "sysctl", "-a", "-r", "^net\\."))
	for what, dir := range map[string]string{"bpffs": paths.BPFFS, "state": paths.State} {
		files, err := tree(dir)
		if err != nil {
			errs = append(errs, err)
		}
		f[node1+what+" files"] = files
	}
	for _, p := range pods {
		pod := "pod " + p.Name + " "
		f[pod+"sysctl net"] = sysctls(cmd(pod+"sysctl net", p.NetNS, "sysctl", "-a", "-r", "^net\\."))
		cmd(pod+"mptcp endpoints", p.NetNS, "ip", "mptcp", "endpoint", "show")
		cmd(pod+"mptcp limits", p.NetNS, "ip", "mptcp", "limits", "show")
		cmd(pod+"ip rule", p.NetNS, "ip", "rule", "show")
		cmd(pod+"tc qdisc", p.NetNS, "tc", "qdisc", "show")
	}
	return f, errors.Join(errs...)
}

// sysctls keeps the settings of `sysctl -a` output, sorted.
func sysctls(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if l != "" && !volatileSysctls.MatchString(l) {
			keep = append(keep, l)
		}
	}
	sort.Strings(keep)
	return strings.Join(keep, "\n")
}

// tcxPrograms names the programs on the TCX ingress and egress of ifname,
// from the kernel's list (Debian 12's bpftool 7.1 lists no TCX).
func tcxPrograms(node *testbed.Node, ifname string) (string, error) {
	var out []string
	for _, hook := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		names, err := tcxProgramNames(node, ifname, hook)
		if err != nil {
			return "", fmt.Errorf("TCX programs of %s: %w", ifname, err)
		}
		out = append(out, fmt.Sprintf("%s: %s", hook, strings.Join(names, ",")))
	}
	return strings.Join(out, "\n"), nil
}

// tree lists the paths under dir, relative to it; nothing when dir is
// missing.
func tree(dir string) (string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel != "." {
			out = append(out, rel)
		}
		return nil
	})
	return strings.Join(out, "\n"), err
}

// Diff lists, per item, the lines that are in f and not in after ("-") and
// the other way round ("+"); empty when they are equal. allow, when set,
// excuses a changed line (with its "-" or "+") that it matches.
func (f Footprint) Diff(after Footprint, allow *regexp.Regexp) string {
	keys := map[string]bool{}
	for k := range f {
		keys[k] = true
	}
	for k := range after {
		keys[k] = true
	}
	var names []string
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		before, now := lines(f[k]), lines(after[k])
		var changed []string
		for _, l := range before {
			if !slices.Contains(now, l) {
				changed = append(changed, "- "+l)
			}
		}
		for _, l := range now {
			if !slices.Contains(before, l) {
				changed = append(changed, "+ "+l)
			}
		}
		changed = slices.DeleteFunc(changed, func(l string) bool { return allow != nil && allow.MatchString(l) })
		if len(changed) > 0 {
			fmt.Fprintf(&b, "%s:\n  %s\n", k, strings.Join(changed, "\n  "))
		}
	}
	return b.String()
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimRight(l, " "); l != "" {
			out = append(out, l)
		}
	}
	return out
}
