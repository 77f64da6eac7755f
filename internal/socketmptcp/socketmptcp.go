package socketmptcp

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// Program is the socket program, attached to update_socket_protocol.
type Program struct {
	objs socketMPTCPObjects
	link link.Link
}

// UnsupportedError says why this kernel refuses the socket program.
type UnsupportedError struct {
	Err error
	// Permanent: the kernel will answer the same while this process runs
	// (lockdown, a security module, capabilities it lacks, no hook), so
	// there is no point asking again. Other failures (memory, a busy
	// trampoline) may pass.
	Permanent bool
	// reason is what the error says, without the library's own hints.
	reason string
}

func (e *UnsupportedError) Error() string {
	if e.reason == "" {
		return "loading the socket program failed: " + e.Err.Error()
	}
	return e.reason
}

func (e *UnsupportedError) Unwrap() error { return e.Err }

// refused classifies a failure to load or attach the program.
func refused(err error) *UnsupportedError {
	u := &UnsupportedError{Err: err, Permanent: true}
	switch {
	case errors.Is(err, unix.EPERM):
		// Not the memory lock the library's message suggests: kernels
		// with this hook (6.6 and later) charge BPF memory to the cgroup,
		// not to RLIMIT_MEMLOCK.
		switch {
		case lockedDown():
			u.reason = "this kernel is in lockdown, which refuses tracing programs (fmod_ret on update_socket_protocol: operation not permitted)"
		case !holdsCapabilities(capBPF, capPerfmon):
			u.reason = "the agent lacks CAP_BPF or CAP_PERFMON, which tracing programs need (fmod_ret on update_socket_protocol: operation not permitted)"
		default:
			u.reason = "this kernel refuses tracing programs (fmod_ret on update_socket_protocol: operation not permitted) to an agent that " +
				"holds CAP_BPF and CAP_PERFMON: kernel lockdown or a security module"
		}
	case errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, os.ErrNotExist):
		u.reason = "this kernel has no update_socket_protocol hook for BPF (Linux 6.6 or later with BTF has it): " + err.Error()
	default:
		u.Permanent = false
		u.reason = "loading the socket program failed: " + err.Error()
	}
	return u
}

// lockedDown reads the kernel's lockdown mode where securityfs shows it
// ("none [integrity] confidentiality": the bracketed one is in force).
func lockedDown() bool {
	b, err := os.ReadFile("/sys/kernel/security/lockdown")
	return err == nil && !strings.Contains(string(b), "[none]")
}

// Capability numbers (linux/capability.h).
const (
	capPerfmon = 38
	capBPF     = 39
)

// holdsCapabilities says whether this process's effective set has caps.
func holdsCapabilities(caps ...uint) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData // 64 capabilities, 32 in each
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	for _, c := range caps {
		if data[c/32].Effective&(1<<(c%32)) == 0 {
			return false
		}
	}
	return true
}

// Load loads the program and attaches it. From then on every TCP socket
// created in a namespace Set lists is MPTCP; none is listed yet. A kernel
// that cannot run the program gives an *UnsupportedError.
func Load() (*Program, error) {
	p := &Program{}
	if err := loadSocketMPTCPObjects(&p.objs, nil); err != nil {
		return nil, refused(err)
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: p.objs.SocketMptcp, AttachType: ebpf.AttachModifyReturn})
	if err != nil {
		p.objs.Close()
		return nil, refused(err)
	}
	p.link = l
	return p, nil
}

// Set makes the namespaces of cookies, and only those, the ones whose TCP
// sockets become MPTCP; namespaces added meanwhile get it for the sockets
// they create from then on.
func (p *Program) Set(cookies map[uint64]bool) error {
	return setNamespaces(p.objs.TransparentNetns, cookies)
}

// setNamespaces makes m, a transparent_netns map, hold cookies and nothing
// else.
func setNamespaces(m *ebpf.Map, cookies map[uint64]bool) error {
	var (
		key   uint64
		value uint8
		stale []uint64
	)
	it := m.Iterate()
	for it.Next(&key, &value) {
		if !cookies[key] {
			stale = append(stale, key)
		}
	}
	errs := []error{it.Err()}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	for k := range cookies {
		if err := m.Update(k, uint8(1), ebpf.UpdateAny); err != nil {
			errs = append(errs, fmt.Errorf("namespace %d: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// Close detaches the program: sockets are created as asked again.
func (p *Program) Close() error {
	return errors.Join(p.link.Close(), p.objs.Close())
}

// NetNSCookie is the cookie of the network namespace of the file
// descriptor fd: the kernel's number for it, which the program compares.
func NetNSCookie(fd int) (uint64, error) {
	var cookie uint64
	err := netnsutil.DoFD(fd, func() error {
		sock, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(sock)
		cookie, err = unix.GetsockoptUint64(sock, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("the cookie of a network namespace: %w", err)
	}
	return cookie, nil
}
