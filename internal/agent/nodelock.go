package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// NodeLock makes an agent process the only one acting on its node: it holds
// an exclusive lock (flock) on the node's state directory for as long as it
// runs, and the kernel releases it when the process ends, even killed.
//
// Two agents can run on one node at once although the chart's DaemonSet
// never surges (maxSurge 0): the DaemonSet controller creates a node's new
// pod as soon as the old one is terminating, not once it has stopped, and
// the kubelet starts it at once. Both would load programs against the same
// pins, and the new one may migrate maps the old one still writes. So a
// starting agent (and -uninstall) waits for the lock first.
type NodeLock struct{ f *os.File }

// LockNode takes the lock of the node whose state directory is stateDir,
// waiting while another process holds it (logging every few seconds, so
// that a blocked start is visible). The directory is created if missing.
func LockNode(stateDir string, log *slog.Logger) (*NodeLock, error) {
	start := time.Now()
	lastLog := time.Time{}
	for {
		if err := os.MkdirAll(stateDir, 0o700); err != nil {
			return nil, err
		}
		f, err := os.Open(stateDir)
		if err != nil {
			return nil, err
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			if time.Since(lastLog) > 5*time.Second {
				log.Info("waiting for the agent that runs on this node to stop", "stateDir", stateDir, "waited", time.Since(start).Round(time.Second).String())
				lastLog = time.Now()
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", stateDir, err)
		}
		// The holder may have removed the directory (an uninstall) before
		// letting go: the lock is then on a directory no one else will
		// open. Lock the one at the path.
		if same, err := samePath(f, stateDir); err != nil || !same {
			f.Close()
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, err
			}
			continue
		}
		if !lastLog.IsZero() {
			log.Info("the agent that ran on this node stopped", "waited", time.Since(start).Round(10*time.Millisecond).String())
		}
		return &NodeLock{f: f}, nil
	}
}

// samePath says whether the open file f is still the file at path.
func samePath(f *os.File, path string) (bool, error) {
	held, err := f.Stat()
	if err != nil {
		return false, err
	}
	now, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	return os.SameFile(held, now), nil
}

// Unlock lets the next agent of the node go on. Closing the descriptor
// releases the lock whatever close reports.
func (l *NodeLock) Unlock() { _ = l.f.Close() }
