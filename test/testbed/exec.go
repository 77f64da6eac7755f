package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// run runs a command in the machine's own namespaces; only bed-management commands that name their target
// namespace explicitly ("ip netns add X", "ip -n X ...") go through it.
func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// ipBatch runs ip commands inside namespace ns. "ip -n" enters the namespace before it parses the batch, and fails
// when the namespace does not exist, so a mistake can never reach the machine's own namespace.
func ipBatch(ctx context.Context, ns string, cmds ...string) error {
	cmd := exec.CommandContext(ctx, "ip", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip -n %s -batch [%s]: %w: %s", ns, strings.Join(cmds, "; "), err, bytes.TrimSpace(out))
	}
	return nil
}

// sysctl sets "key=value" settings inside namespace ns.
func (b *Bed) sysctl(ctx context.Context, ns string, kv ...string) error {
	if ns == "" {
		return errors.New("sysctl without a namespace")
	}
	args := append([]string{"netns", "exec", ns, "sysctl", "-q", "-w"}, kv...)
	return run(ctx, "ip", args...)
}

// Sysctl sets key to value in namespace ns.
func (b *Bed) Sysctl(ns, key, value string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return b.sysctl(ctx, ns, key+"="+value)
}

// bpffsAlias is a second mount point of the machine's bpffs outside /sys. "ip netns exec" replaces /sys with a
// sysfs of the target namespace, which hides /sys/fs/bpf; Command binds the alias back onto /sys/fs/bpf inside the
// command's private mount namespace, so that programs in a node namespace see the same pins as the test.
const bpffsAlias = "/run/mptcp-testbed/bpffs"

// execWrapper runs inside "ip netns exec": restore bpffs at /sys/fs/bpf if the alias exists, then exec the command.
const execWrapper = `if [ -d ` + bpffsAlias + ` ] && ! mountpoint -q /sys/fs/bpf && mountpoint -q ` + bpffsAlias + `; then mount --bind ` + bpffsAlias + ` /sys/fs/bpf; fi; exec "$@"`

// Command returns a command that runs args inside namespace ns, through "ip netns exec" (so /sys describes that
// namespace), with the bed's bpffs visible at /sys/fs/bpf.
func (b *Bed) Command(ns string, args ...string) *exec.Cmd {
	return b.CommandContext(context.Background(), ns, args...)
}

// CommandContext is Command with a context that kills the command (by its PID) when done.
func (b *Bed) CommandContext(ctx context.Context, ns string, args ...string) *exec.Cmd {
	full := append([]string{"netns", "exec", ns, "sh", "-c", execWrapper, "testbed-exec"}, args...)
	return exec.CommandContext(ctx, "ip", full...)
}

// Process is a long-running command the bed started and will stop in Down.
type Process struct {
	NetNS string
	Args  []string
	Cmd   *exec.Cmd
	// PID is the command's own process id ("ip netns exec" and the wrapper exec into it).
	PID int
	// Stdout and Stderr are the paths of its output files.
	Stdout, Stderr string

	done chan struct{}
	err  error
}

// Start starts args inside namespace ns and tracks the process so that Down stops it. Output goes to files in the
// bed's directory.
func (b *Bed) Start(ns string, args ...string) (*Process, error) {
	return b.StartCommand(ns, args, b.Command(ns, args...))
}

// StartCommand starts cmd, which the caller has built to run args inside namespace ns by other means than
// Command (the real nodes' containerd and kubelet enter the node's network namespace with nsenter and keep the
// machine's /sys, which runc needs), and tracks it as Start does: output in files in the bed's directory,
// stopped by its PID in Down.
func (b *Bed) StartCommand(ns string, args []string, cmd *exec.Cmd) (*Process, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return nil, errors.New("bed is down")
	}
	base := filepath.Join(b.Dir, fmt.Sprintf("%s-%s-%d", ns, filepath.Base(args[0]), len(b.procs)))
	p := &Process{NetNS: ns, Args: args, Stdout: base + ".out", Stderr: base + ".err", done: make(chan struct{})}
	stdout, err := os.Create(p.Stdout)
	if err != nil {
		return nil, err
	}
	stderr, err := os.Create(p.Stderr)
	if err != nil {
		stdout.Close()
		return nil, err
	}
	p.Cmd = cmd
	p.Cmd.Stdout, p.Cmd.Stderr = stdout, stderr
	if err := p.Cmd.Start(); err != nil {
		stdout.Close()
		stderr.Close()
		return nil, err
	}
	p.PID = p.Cmd.Process.Pid
	b.procs = append(b.procs, p)
	go func() {
		p.err = p.Cmd.Wait()
		stdout.Close()
		stderr.Close()
		close(p.done)
	}()
	return p, nil
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits for the process to exit or ctx to end.
func (p *Process) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Signal sends sig to the process (by its PID), unless it has exited.
func (p *Process) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	return p.Cmd.Process.Signal(sig)
}

// Stop sends SIGTERM, waits up to grace, then SIGKILL. Exits caused by those signals are not errors.
func (p *Process) Stop(grace time.Duration) error {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = p.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("process %d (%s) did not exit after SIGKILL", p.PID, strings.Join(p.Args, " "))
	}
}

// Output returns what the process wrote to stdout so far.
func (p *Process) Output() string {
	b, _ := os.ReadFile(p.Stdout)
	return string(b)
}

// ErrOutput returns what the process wrote to stderr so far.
func (p *Process) ErrOutput() string {
	b, _ := os.ReadFile(p.Stderr)
	return string(b)
}

// WaitOutput waits until the process's stdout or stderr contains s. It fails early if the process exits first.
func (p *Process) WaitOutput(ctx context.Context, s string) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if strings.Contains(p.Output(), s) || strings.Contains(p.ErrOutput(), s) {
			return nil
		}
		select {
		case <-p.done:
			if strings.Contains(p.Output(), s) || strings.Contains(p.ErrOutput(), s) {
				return nil
			}
			return fmt.Errorf("%s exited (%w) before printing %q; stderr: %s", p.Args[0], p.err, s, p.ErrOutput())
		case <-ctx.Done():
			return fmt.Errorf("waiting for %q from %s: %w; stderr: %s", s, p.Args[0], ctx.Err(), p.ErrOutput())
		case <-t.C:
		}
	}
}

// StartCPULoad starts n busy loops (one per core keeps a 2-core machine
// saturated) in the first node's namespace and returns a function that
// stops them; Down stops them too. Tests use it to reproduce what traffic
// does on a loaded machine.
func (b *Bed) StartCPULoad(n int) (stop func(), err error) {
	var procs []*Process
	stop = func() {
		for _, p := range procs {
			_ = p.Stop(time.Second)
		}
	}
	for range n {
		p, err := b.Start(b.Nodes[0].NetNS, "sh", "-c", "while :; do :; done")
		if err != nil {
			stop()
			return nil, err
		}
		procs = append(procs, p)
	}
	return stop, nil
}
