// kernelcheck runs, in a guest booted with a node kernel of the project's
// matrix, what the agent asks of a node's kernel, step by step as the agent
// does it: its kernel check (the floor, MPTCP), BTF, the datapath's programs
// through this kernel's verifier, its TCX links on an interface, and the
// transparent-MPTCP socket program. It prints one JSON line per step and goes on after a failed step
// where the next does not depend on it.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/nodecheck"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/socketmptcp"
	"github.com/mptcp-operator/mptcp-operator/test/kernels"
)

// pinDir is where the datapath pins, on a bpffs this program mounts (the
// guest's init mounts none).
const pinDir = "/sys/fs/bpf/mptcp-operator"

func main() {
	out := json.NewEncoder(os.Stdout)
	report := func(step string, err error) bool {
		r := kernels.Step{Name: step, OK: err == nil}
		if err != nil {
			r.Error = err.Error()
		}
		_ = out.Encode(r)
		return err == nil
	}
	var u unix.Utsname
	_ = unix.Uname(&u)
	_ = out.Encode(kernels.Step{Name: kernels.Release, OK: true, Detail: unix.ByteSliceToString(u.Release[:])})
	// The agent's own kernel check: below the floor, or without MPTCP,
	// it loads nothing. The steps after it go on regardless, to show what
	// such a kernel does with the datapath.
	for _, c := range nodecheck.Run(nodecheck.Node{ProcSys: "/proc/sys"}) {
		if c.Name == nodecheck.Kernel {
			var err error
			if c.Result == mptcpv1alpha1.CheckFailed {
				err = errors.New(c.Reason + ": " + c.Message)
			}
			report(kernels.Kernel, err)
		}
	}
	_, err := os.Stat("/sys/kernel/btf/vmlinux")
	report(kernels.BTF, err)
	err = os.MkdirAll("/sys/fs/bpf", 0o755)
	if err == nil {
		err = unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, "")
	}
	if !report(kernels.BPFFS, err) {
		return
	}
	dp, err := datapath.Load(datapath.Options{PinDir: pinDir})
	if !report(kernels.Verifier, err) {
		return
	}
	defer dp.Close()
	var attachErr error
	for _, h := range datapath.Hooks {
		attachErr = errors.Join(attachErr, dp.Attach(datapath.Attachment{Interface: "lo", Hook: h}))
	}
	report(kernels.TCX, attachErr)
	p, err := socketmptcp.Load()
	if err == nil {
		err = p.Close()
	}
	report(kernels.SocketProgram, err)
	fmt.Fprintln(os.Stderr, "kernelcheck: done")
}
