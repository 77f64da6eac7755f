package nodecheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/cni"
)

func find(t *testing.T, checks []mptcpv1alpha1.NodeCheck, name string) mptcpv1alpha1.NodeCheck {
	t.Helper()
	for _, c := range checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %s in %+v", name, checks)
	return mptcpv1alpha1.NodeCheck{}
}

// A CNI whose marks share a bit with the agent's mask fails the Marks
// check, which names both masks and a mask that is free; the summary is
// False with MarkClash, where a CNI that is only untested warns.
func TestAMarkClashFailsWithAFreeMaskToUse(t *testing.T) {
	calico := cni.Network{Name: "calico", Mode: "routed", Marks: 0xffff0000, Support: cni.Untested, Note: "routed veths"}
	checks := Run(Node{ProcSys: "/proc/sys", BTF: "/sys/kernel/btf/vmlinux", PinDir: t.TempDir(), Network: calico, MarkMask: 0x00f00000})
	m := find(t, checks, Marks)
	if m.Result != mptcpv1alpha1.CheckFailed || m.Reason != ReasonMarkClash {
		t.Fatalf("marks check %+v, want Failed MarkClash", m)
	}
	for _, want := range []string{"calico", "0xffff0000", "0x00f00000", "0x00000f00", "agent.markMask", "agent.cni.marks"} {
		if !strings.Contains(m.Message, want) {
			t.Errorf("marks check message lacks %q: %s", want, m.Message)
		}
	}
	if ok, reason, _ := Summary([]mptcpv1alpha1.NodeCheck{find(t, checks, CNI), m}); ok || reason != ReasonMarkClash {
		t.Errorf("summary %v %s, want False MarkClash", ok, reason)
	}
	if c := find(t, checks, CNI); c.Result != mptcpv1alpha1.CheckWarning || c.Reason != ReasonCNIUntested || !strings.Contains(c.Message, "calico (routed)") {
		t.Errorf("CNI check %+v, want a warning naming calico (routed)", c)
	}

	// With a mask Calico leaves free, the marks pass.
	if m := find(t, Run(Node{Network: calico, MarkMask: 0x00000f00}), Marks); m.Result != mptcpv1alpha1.CheckPassed {
		t.Errorf("marks check with a free mask: %+v", m)
	}
	// Cilium beside kube-proxy leaves no nibble: the message says where
	// kube-proxy does not run.
	cilium := cni.Network{Name: "cilium", Marks: 0xffff0fff}
	if m := find(t, Run(Node{Network: cilium, MarkMask: 0x00f00000}), Marks); !strings.Contains(m.Message, "where kube-proxy does not run") || !strings.Contains(m.Message, "0x0000f000") {
		t.Errorf("marks check beside cilium: %s", m.Message)
	}
}

// What the kernel, BTF and bpffs checks find on a node lacking each.
func TestTheKernelBTFAndBPFFSChecksNameWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	checks := Run(Node{ProcSys: dir, BTF: filepath.Join(dir, "vmlinux"), PinDir: filepath.Join(dir, "pins", "node-1"), MarkMask: 0x00f00000})
	for name, reason := range map[string]string{Kernel: ReasonNoMPTCP, BTF: ReasonNoBTF, BPFFS: ReasonNoBPFFS} {
		if c := find(t, checks, name); c.Result != mptcpv1alpha1.CheckFailed || c.Reason != reason || c.Message == "" {
			t.Errorf("%s check %+v, want Failed %s with a message", name, c, reason)
		}
	}
	if ok, reason, msg := Summary(checks); ok || reason != ReasonNoMPTCP || !strings.HasPrefix(msg, "Kernel: ") {
		t.Errorf("summary %v %s %q, want False NoMPTCP, the first failed", ok, reason, msg)
	}

	if err := os.MkdirAll(filepath.Join(dir, "net", "mptcp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "net", "mptcp", "enabled"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vmlinux"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	checks = Run(Node{ProcSys: dir, BTF: filepath.Join(dir, "vmlinux"), PinDir: dir, MarkMask: 0x00f00000})
	for _, name := range []string{Kernel, BTF} {
		if c := find(t, checks, name); c.Result != mptcpv1alpha1.CheckPassed {
			t.Errorf("%s check %+v, want Passed", name, c)
		}
	}
}

func TestPodCIDRsAndTheSummary(t *testing.T) {
	if c := NodePodCIDRs(nil); c.Result != mptcpv1alpha1.CheckFailed || c.Reason != ReasonNoPodCIDRs || !strings.Contains(c.Message, "spec.podCIDRs") {
		t.Errorf("no pod CIDRs: %+v", c)
	}
	c := NodePodCIDRs([]string{"10.244.1.0/24", "fd00:10:244:1::/64"})
	if c.Result != mptcpv1alpha1.CheckPassed || c.Message != "10.244.1.0/24, fd00:10:244:1::/64" {
		t.Errorf("pod CIDRs: %+v", c)
	}
	if ok, reason, _ := Summary([]mptcpv1alpha1.NodeCheck{c}); !ok || reason != mptcpv1alpha1.ReasonChecksPassed {
		t.Errorf("summary of a passed check: %v %s", ok, reason)
	}
	warn := mptcpv1alpha1.NodeCheck{Name: CNI, Result: mptcpv1alpha1.CheckWarning, Reason: ReasonCNIUnknown, Message: "weave-net"}
	if ok, reason, msg := Summary([]mptcpv1alpha1.NodeCheck{c, warn}); !ok || reason != mptcpv1alpha1.ReasonChecksWarned || msg != "CNI: weave-net" {
		t.Errorf("summary with a warning: %v %s %q", ok, reason, msg)
	}
}

// A kernel older than the floor fails the kernel check, naming itself and
// the floor; a newer one, or one whose release cannot be read, passes on to
// the MPTCP check.
func TestAKernelBelowTheFloorIsNamed(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "net", "mptcp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "net", "mptcp", "enabled"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for release, want := range map[string]string{
		"6.1.0-56-cloud-amd64":       ReasonKernelOld,
		"5.15.0-119-generic":         ReasonKernelOld,
		"6.6.45":                     "",
		"6.12.117+deb12-cloud-amd64": "",
		"7.0.1":                      "",
		"":                           "",
	} {
		c := kernelRelease(release, dir)
		if c.Reason != want || (want == "") != (c.Result == mptcpv1alpha1.CheckPassed) {
			t.Errorf("%q: %+v, want reason %q", release, c, want)
		}
		if want != "" && (!strings.Contains(c.Message, "Linux "+release) || !strings.Contains(c.Message, "older than 6.6")) {
			t.Errorf("%q: message %q names neither the kernel nor the floor", release, c.Message)
		}
	}
}
