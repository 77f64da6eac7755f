package podnet

import (
	"context"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
)

// namespaceOf is the identity of the network namespace a socket lives in
// (SIOCGSKNS).
func namespaceOf(t *testing.T, c *mptcpnl.Conn) netnsID {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var nsfd int
	var ierr error
	if err := raw.Control(func(fd uintptr) { nsfd, ierr = unix.IoctlRetInt(int(fd), unix.SIOCGSKNS) }); err != nil {
		t.Fatal(err)
	}
	if ierr != nil {
		t.Fatalf("SIOCGSKNS: %v", ierr)
	}
	defer unix.Close(nsfd)
	var st syscall.Stat_t
	if err := syscall.Fstat(nsfd, &st); err != nil {
		t.Fatal(err)
	}
	return netnsID{Dev: st.Dev, Ino: st.Ino}
}

// A path manager whose pod's namespace path now names another namespace
// (a /proc/<pid>/ns/net whose PID was reused, a re-created sandbox) never
// listens there: one asked to start for the old namespace refuses, and one
// that restarts after its socket failed listens in the namespace it was
// started for, not in the one the path names now.
func TestPathManagerNeverListensInANamespaceThatIsNotItsPods(t *testing.T) {
	bed := newPMBed(t)
	log := slog.New(slog.DiscardHandler)
	oldKey, err := keyOf(bed.client)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := start(context.Background(), Want{Pod: bed.client, Joins: 1}, oldKey, defaultBackoff, log, PathManagerOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pm.stop)
	var sess *session
	for deadline := time.Now().Add(5 * time.Second); sess == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		sess = pm.current.Load()
	}
	if sess == nil {
		t.Fatal("the path manager has no session")
	}

	bed.recreateClient(t)
	if pm2, err := start(context.Background(), Want{Pod: bed.client, Joins: 1}, oldKey, defaultBackoff, log, PathManagerOptions{}, nil); err == nil {
		pm2.stop()
		t.Errorf("a path manager started for the old namespace at a path that names a new one")
	} else if !strings.Contains(err.Error(), "not the pod's") {
		t.Errorf("starting for the old namespace: %v, want it refused as not the pod's", err)
	}

	sess.events.Close()
	var next *session
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if next = pm.current.Load(); next != nil && next != sess {
			break
		}
	}
	if next == nil || next == sess {
		t.Fatal("the path manager did not restart")
	}
	if got := namespaceOf(t, next.events); got != oldKey.netns {
		t.Errorf("the restarted path manager listens in namespace %+v, want its pod's %+v", got, oldKey.netns)
	}
	if got := namespaceOf(t, next.cmds); got != oldKey.netns {
		t.Errorf("the restarted path manager sends commands in namespace %+v, want its pod's %+v", got, oldKey.netns)
	}
}
