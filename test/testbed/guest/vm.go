package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// Accel is how QEMU runs the guest's CPU.
type Accel string

const (
	// TCG emulates the CPU in software: slower, and works everywhere,
	// including nested in a VM whose KVM cannot run this guest.
	TCG Accel = "tcg"
	// KVM uses the host's hardware virtualisation.
	KVM Accel = "kvm"
)

// AccelEnv chooses the accelerator (tcg or kvm); tcg when unset.
const AccelEnv = "MPTCP_GUEST_ACCEL"

// AccelFromEnv is the accelerator AccelEnv names.
func AccelFromEnv() (Accel, error) {
	switch a := Accel(os.Getenv(AccelEnv)); a {
	case "", TCG:
		return TCG, nil
	case KVM:
		return KVM, nil
	default:
		return "", fmt.Errorf("%s=%q: want tcg or kvm", AccelEnv, a)
	}
}

// Machine is how one guest is run.
type Machine struct {
	Image Image
	Accel Accel
	// MemoryMiB and CPUs size the guest: 256 MiB and one vCPU fit two
	// guests beside a test bed on two cores.
	MemoryMiB, CPUs int
	// Tap is the tap device QEMU creates in its network namespace for the
	// guest's eth0, and MAC the guest's address on it.
	Tap string
	MAC net.HardwareAddr
	// Console and Control are the paths of the guest's console log and of
	// the control socket QEMU listens on.
	Console, Control string
}

// QEMUArgs is the command line that boots m.
func (m Machine) QEMUArgs() []string {
	return []string{
		"qemu-system-x86_64",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-machine", "q35,accel=" + string(m.Accel),
		"-cpu", map[Accel]string{TCG: "max", KVM: "host"}[m.Accel],
		"-m", fmt.Sprint(m.MemoryMiB), "-smp", fmt.Sprint(m.CPUs),
		"-kernel", m.Image.Kernel, "-initrd", m.Image.Initramfs,
		// panic=-1 reboots at once on a panic, and -no-reboot turns
		// that into QEMU's exit.
		"-append", "console=ttyS0 panic=-1 rdinit=/init",
		"-netdev", "tap,id=n0,ifname=" + m.Tap + ",script=no,downscript=no",
		// No option ROM: the kernel boots directly, and iPXE would only
		// slow it down.
		"-device", "virtio-net-pci,netdev=n0,romfile=,mac=" + m.MAC.String(),
		"-serial", "file:" + m.Console,
		// wait=on: the guest starts only once the host is connected, so
		// guestd's hello, written once, is never lost.
		"-serial", "unix:" + m.Control + ",server=on,wait=on",
	}
}

// VM is a booted guest, driven through guestd on its control port.
type VM struct {
	Hello Hello
	conn  net.Conn

	mu      sync.Mutex
	nextID  uint64
	waiting map[uint64]chan Response
	err     error // why the control port closed
}

// Connect waits (until ctx ends) for QEMU's control socket and guestd's
// hello on it.
func Connect(ctx context.Context, control string) (*VM, error) {
	var conn net.Conn
	for {
		var err error
		var d net.Dialer
		if conn, err = d.DialContext(ctx, "unix", control); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("guest control socket %s: %w", control, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	vm := &VM{conn: conn, waiting: map[uint64]chan Response{}}
	lines := bufio.NewScanner(conn)
	lines.Buffer(make([]byte, 64<<10), maxLine)
	hello := make(chan error, 1)
	go func() {
		if !lines.Scan() {
			hello <- fmt.Errorf("%w (or EOF)", lines.Err())
			return
		}
		hello <- json.Unmarshal(lines.Bytes(), &vm.Hello)
	}()
	select {
	case err := <-hello:
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("guestd's hello: %w", err)
		}
	case <-ctx.Done():
		conn.Close()
		return nil, fmt.Errorf("no hello from guestd: %w", ctx.Err())
	}
	go vm.read(lines)
	return vm, nil
}

// maxLine bounds a line from the guest: guestd caps a command's stdout and
// stderr at 1 MiB each, which JSON escaping may grow several times. A
// guest that sends more without a newline has its port closed.
const maxLine = 16 << 20

func (vm *VM) read(lines *bufio.Scanner) {
	for {
		if !lines.Scan() {
			err := lines.Err()
			if err == nil {
				err = errors.New("closed")
			}
			vm.mu.Lock()
			vm.err = fmt.Errorf("guest control port: %w", err)
			for id, c := range vm.waiting {
				close(c)
				delete(vm.waiting, id)
			}
			vm.mu.Unlock()
			vm.conn.Close()
			return
		}
		var resp Response
		if err := json.Unmarshal(lines.Bytes(), &resp); err != nil {
			continue
		}
		vm.mu.Lock()
		c := vm.waiting[resp.ID]
		delete(vm.waiting, resp.ID)
		vm.mu.Unlock()
		if c != nil {
			c <- resp
		}
	}
}

// Close closes the control port; the guest keeps running until QEMU is
// stopped.
func (vm *VM) Close() error { return vm.conn.Close() }

// send writes req and returns the channel its response arrives on.
func (vm *VM) send(req Request) (uint64, chan Response, error) {
	vm.mu.Lock()
	if vm.err != nil {
		vm.mu.Unlock()
		return 0, nil, vm.err
	}
	vm.nextID++
	req.ID = vm.nextID
	c := make(chan Response, 1)
	vm.waiting[req.ID] = c
	vm.mu.Unlock()
	b, err := json.Marshal(req)
	if err == nil {
		_, err = vm.conn.Write(append(b, '\n'))
	}
	if err != nil {
		vm.mu.Lock()
		delete(vm.waiting, req.ID)
		vm.mu.Unlock()
		return 0, nil, err
	}
	return req.ID, c, nil
}

// DefaultTimeout bounds a request whose context has no deadline: no
// command the bed runs in a guest takes half as long, and a guest that
// stopped answering must fail its test rather than hang the run.
const DefaultTimeout = 5 * time.Minute

// Do sends req and waits for its response (for DefaultTimeout at most
// when ctx has no deadline); a response that says the request failed is
// an error.
func (vm *VM) Do(ctx context.Context, req Request) (Response, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	_, c, err := vm.send(req)
	if err != nil {
		return Response{}, err
	}
	return vm.await(ctx, req.Op, c)
}

func (vm *VM) await(ctx context.Context, op string, c chan Response) (Response, error) {
	select {
	case resp, ok := <-c:
		if !ok {
			vm.mu.Lock()
			defer vm.mu.Unlock()
			return Response{}, vm.err
		}
		if resp.Error != "" {
			return resp, fmt.Errorf("guest %s: %s", op, resp.Error)
		}
		return resp, nil
	case <-ctx.Done():
		return Response{}, fmt.Errorf("guest %s: %w", op, ctx.Err())
	}
}

// Run runs a command in the guest and returns its stdout; a non-zero exit
// is an error that carries its stderr.
func (vm *VM) Run(ctx context.Context, args ...string) (string, error) {
	resp, err := vm.Do(ctx, Request{Op: OpExec, Args: args})
	if err != nil {
		return resp.Stdout, err
	}
	if resp.Exit != 0 {
		return resp.Stdout, fmt.Errorf("guest: %s exited %d: %s", strings.Join(args, " "), resp.Exit, strings.TrimSpace(resp.Stderr))
	}
	return resp.Stdout, nil
}

// Process is a command started in the guest.
type Process struct {
	vm   *VM
	id   uint64
	args []string
}

// Start starts a command in the guest and returns at once.
func (vm *VM) Start(ctx context.Context, args ...string) (*Process, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	id, c, err := vm.send(Request{Op: OpStart, Args: args})
	if err != nil {
		return nil, err
	}
	if _, err := vm.await(ctx, OpStart, c); err != nil {
		return nil, err
	}
	return &Process{vm: vm, id: id, args: args}, nil
}

// Wait waits for the process to exit and returns what it printed.
func (p *Process) Wait(ctx context.Context) (Response, error) {
	return p.vm.Do(ctx, Request{Op: OpWait, Proc: p.id})
}

// Signal sends sig to the process.
func (p *Process) Signal(ctx context.Context, sig syscall.Signal) error {
	_, err := p.vm.Do(ctx, Request{Op: OpSignal, Proc: p.id, Signal: int(sig)})
	return err
}

// Configure sets the guest's eth0 as a tenant would.
func (vm *VM) Configure(ctx context.Context, c NetConfig) error {
	_, err := vm.Do(ctx, Request{Op: OpNet, Net: &c})
	return err
}

// ConfigureMPTCP sets the guest's in-kernel path manager as a tenant
// would (ip mptcp limits set, ip mptcp endpoint add).
func (vm *VM) ConfigureMPTCP(ctx context.Context, c MPTCPConfig) error {
	_, err := vm.Do(ctx, Request{Op: OpMPTCP, MPTCP: &c})
	return err
}

// ReadFile reads a file of the guest (/proc/net/netstat, a sysctl).
func (vm *VM) ReadFile(ctx context.Context, path string) (string, error) {
	resp, err := vm.Do(ctx, Request{Op: OpRead, Path: path})
	return resp.Stdout, err
}

// Subflows lists the guest's established MPTCP subflows.
func (vm *VM) Subflows(ctx context.Context) ([]mptcpnl.Subflow, error) {
	resp, err := vm.Do(ctx, Request{Op: OpSubflows})
	if err != nil {
		return nil, err
	}
	var sfs []mptcpnl.Subflow
	return sfs, json.Unmarshal([]byte(resp.Stdout), &sfs)
}

// Counter reads one of the guest kernel's SNMP counters by the name nstat
// gives it: a section of /proc/net/netstat or /proc/net/snmp and a field,
// as in MPTcpExtMPJoinSynRx or TcpAttemptFails.
func (vm *VM) Counter(ctx context.Context, name string) (float64, error) {
	for _, file := range []string{"/proc/net/netstat", "/proc/net/snmp"} {
		text, err := vm.ReadFile(ctx, file)
		if err != nil {
			return 0, err
		}
		if v, ok := testutil.SNMPCounter(text, name); ok {
			return v, nil
		}
	}
	return 0, fmt.Errorf("the guest has no counter %s", name)
}

// WriteFile writes a file of the guest (a sysctl).
func (vm *VM) WriteFile(ctx context.Context, path, data string) error {
	_, err := vm.Do(ctx, Request{Op: OpWrite, Path: path, Data: data})
	return err
}
