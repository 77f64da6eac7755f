// Package kernels runs what the agent asks of a node's kernel on each kernel
// of the project's matrix, in a QEMU guest booted with that kernel
// (TestKernels; `make test-kernels`). kernelcheck is the guest's side.
package kernels

// Step is one line of kernelcheck's report.
type Step struct {
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Detail is what the step found (the kernel's release), Error why it
	// failed.
	Detail string `json:"detail,omitempty"`
	Error  string `json:"error,omitempty"`
}

// The steps, in the order kernelcheck takes them.
const (
	Release       = "release"        // uname -r
	Kernel        = "kernel"         // the agent's kernel check: the floor, MPTCP
	BTF           = "btf"            // /sys/kernel/btf/vmlinux
	BPFFS         = "bpffs"          // a bpffs mounted for the pins
	Verifier      = "verifier"       // every datapath program and map loaded
	TCX           = "tcx"            // each hook's program attached to lo with a TCX link
	SocketProgram = "socket-program" // transparent MPTCP's fmod_ret program loaded and attached
)
