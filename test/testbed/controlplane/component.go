package controlplane

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// component is a control-plane binary the control plane runs as a process
// on the machine (the controller, kube-controller-manager, kube-scheduler),
// with its output in one log file, stopped by its PID.
type component struct {
	name   string
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
}

// startComponent starts bin with args, its output to dir/<name>.log.
func startComponent(dir, name, bin string, args ...string) (*component, error) {
	path := filepath.Join(dir, name+".log")
	log, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &component{name: name, cmd: cmd, log: path, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(c.exited)
	}()
	return c, nil
}

// stop sends SIGTERM, and SIGKILL after grace.
func (c *component) stop(grace time.Duration) {
	if c == nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// running fails with the component's log if it has exited.
func (c *component) running() error {
	select {
	case <-c.exited:
		raw, _ := os.ReadFile(c.log)
		return fmt.Errorf("%s exited: %s", c.name, tail(raw, 2000))
	default:
		return nil
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
