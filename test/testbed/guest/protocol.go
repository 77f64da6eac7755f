// Package guest boots real VM guests for the test bed: a Debian cloud kernel
// under QEMU with a small initramfs whose init is guestd, attached to a
// pod's network namespace the way KubeVirt attaches a VMI (bridge or
// masquerade binding). The guest's kernel is not the node's and the
// operator configures nothing in it: the test bed plays the tenant, and
// configures it through guestd over a serial port.
package guest

import "net/netip"

// Request is one line the host writes on the guest's control port. Op
// says what the guest does; the other fields are its arguments.
type Request struct {
	ID uint64 `json:"id"`
	Op string `json:"op"`
	// Args is the command line of exec and start.
	Args []string `json:"args,omitempty"`
	// Proc names the process of wait and signal: the ID of the start
	// request that began it.
	Proc uint64 `json:"proc,omitempty"`
	// Signal is the signal number of signal.
	Signal int `json:"signal,omitempty"`
	// Net is the interface configuration of net.
	Net *NetConfig `json:"net,omitempty"`
	// MPTCP is the path manager configuration of mptcp.
	MPTCP *MPTCPConfig `json:"mptcp,omitempty"`
	// Path is the file of read and write; Data what write writes.
	Path string `json:"path,omitempty"`
	Data string `json:"data,omitempty"`
}

// The operations guestd answers.
const (
	OpExec   = "exec"   // run Args and answer when they exit
	OpStart  = "start"  // start Args and answer at once
	OpWait   = "wait"   // answer when process Proc exits
	OpSignal = "signal" // send Signal to process Proc
	OpNet    = "net"    // configure an interface
	OpMPTCP  = "mptcp"  // configure the in-kernel path manager
	OpRead   = "read"   // read a file (a sysctl, /proc/net/netstat)
	OpWrite  = "write"  // write a file (a sysctl)
	// OpSubflows answers with the guest's established MPTCP subflows, as
	// JSON in Stdout (what ss -tiM shows).
	OpSubflows = "subflows"
)

// Response answers the request with the same ID.
type Response struct {
	ID uint64 `json:"id"`
	// Error is why the request failed; empty when it did not. A command
	// that ran and exited non-zero is no error: see Exit.
	Error  string `json:"error,omitempty"`
	Exit   int    `json:"exit"`
	Stdout string `json:"stdout,omitempty"`
	Stderr string `json:"stderr,omitempty"`
}

// Hello is the first line guestd writes once the guest is up.
type Hello struct {
	Kernel string `json:"kernel"`
	// Ready is the time from the kernel's start to guestd's first line.
	UptimeMillis int64 `json:"uptimeMillis"`
}

// NetConfig is one interface's address, routes and MTU.
type NetConfig struct {
	Interface string       `json:"interface"`
	Addr      netip.Prefix `json:"addr"`
	Gateway   netip.Addr   `json:"gateway,omitempty"`
	MTU       int          `json:"mtu,omitempty"`
}

// MPTCPConfig is the guest's in-kernel path manager: its limits and
// endpoints, as `ip mptcp limits set` and `ip mptcp endpoint add` set
// them. Endpoints replace the existing ones.
type MPTCPConfig struct {
	Subflows        uint32     `json:"subflows"`
	AddAddrAccepted uint32     `json:"addAddrAccepted"`
	Endpoints       []Endpoint `json:"endpoints,omitempty"`
}

// Endpoint is one `ip mptcp endpoint add ADDR [port PORT] [dev IF] FLAGS`.
type Endpoint struct {
	Addr      netip.Addr `json:"addr"`
	Port      uint16     `json:"port,omitempty"`
	Interface string     `json:"interface,omitempty"`
	// Flags are the endpoint's: signal, subflow, backup, fullmesh.
	Flags []string `json:"flags"`
}
