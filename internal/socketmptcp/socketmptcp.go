package socketmptcp

import (
	"errors"
	"fmt"
	"os"

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
type UnsupportedError struct{ Err error }

func (e *UnsupportedError) Error() string {
	switch {
	case errors.Is(e.Err, unix.EPERM):
		// Not the memory lock the library's message suggests: kernels
		// with this hook (6.6 and later) charge BPF memory to the cgroup,
		// not to RLIMIT_MEMLOCK.
		return "this kernel refuses tracing programs (fmod_ret on update_socket_protocol: operation not permitted), as it does under lockdown"
	case errors.Is(e.Err, ebpf.ErrNotSupported), errors.Is(e.Err, os.ErrNotExist):
		return "this kernel has no update_socket_protocol hook for BPF (Linux 6.6 or later with BTF has it): " + e.Err.Error()
	}
	return "this kernel refuses the socket program: " + e.Err.Error()
}

func (e *UnsupportedError) Unwrap() error { return e.Err }

// Load loads the program and attaches it. From then on every TCP socket
// created in a namespace Set lists is MPTCP; none is listed yet. A kernel
// that cannot run the program gives an *UnsupportedError.
func Load() (*Program, error) {
	p := &Program{}
	if err := loadSocketMPTCPObjects(&p.objs, nil); err != nil {
		return nil, &UnsupportedError{Err: err}
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: p.objs.SocketMptcp, AttachType: ebpf.AttachModifyReturn})
	if err != nil {
		p.objs.Close()
		return nil, &UnsupportedError{Err: err}
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

// NetNSCookie is the cookie of the network namespace at path: the
// kernel's number for it, which the program compares.
func NetNSCookie(path string) (uint64, error) {
	var cookie uint64
	err := netnsutil.Do(path, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		cookie = v
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("the cookie of network namespace %s: %w", path, err)
	}
	return cookie, nil
}
