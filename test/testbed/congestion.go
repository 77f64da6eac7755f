package testbed

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// allowedCC is the machine's list of the congestion controls a network
// namespace other than its own may take as its default (the kernel refuses
// the others with EPERM): reno and the kernel's built-in default (bbr on
// this machine's kernel), unless an admin adds more. It is the machine's
// one list, every bed's nodes and pods share it.
const allowedCC = "net.ipv4.tcp_allowed_congestion_control"

// ccHolders is the file whose flock counts the holders of a widened list,
// in every test process: each holds it shared, and the last to let go (the
// one that can then take it exclusively) narrows the list again. It holds
// the names the holders added, one per line. ccMutex, held exclusively,
// makes widening, letting go and narrowing one step each.
var (
	ccHolders = filepath.Join(filepath.Dir(stateDir), "allowed-cc.holders")
	ccMutex   = filepath.Join(filepath.Dir(stateDir), "allowed-cc.lock")
)

// lockFile opens path and flocks it how says.
func lockFile(path string, how int) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// AllowCongestionControl lets the bed's namespaces take name as their
// default, as a node whose pods run the product's default (cubic) must
// allow it: the machine's list gets name added unless it has it. The
// returned release puts the list back once no bed of any test process
// holds it widened any more; until release, name stays allowed.
func AllowCongestionControl(name string) (release func() error, err error) {
	mu, err := lockFile(ccMutex, unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer mu.Close()
	holder, err := lockFile(ccHolders, unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	err = func() error {
		list, err := netnsutil.ReadSysctl("", allowedCC)
		if err != nil {
			return err
		}
		if slices.Contains(strings.Fields(list), name) {
			return nil
		}
		if err := netnsutil.WriteSysctl("", allowedCC, list+" "+name); err != nil {
			return err
		}
		// Recorded only once the list has it: a failed write leaves
		// nothing to take out.
		st, err := holder.Stat()
		if err != nil {
			return err
		}
		_, err = holder.WriteAt([]byte(name+"\n"), st.Size())
		return err
	}()
	if err != nil {
		_ = holder.Close()
		return nil, fmt.Errorf("allowing congestion control %s in namespaces: %w", name, err)
	}
	return func() error { return narrowAllowedCC(holder) }, nil
}

// narrowAllowedCC lets go of holder's hold; the last holder takes the names
// the holders added out of the machine's list again.
func narrowAllowedCC(holder *os.File) error {
	defer holder.Close()
	mu, err := lockFile(ccMutex, unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer mu.Close()
	fd := int(holder.Fd())
	if err := unix.Flock(fd, unix.LOCK_UN); err != nil {
		return err
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		return nil // another bed holds it
	} else if err != nil {
		return err
	}
	return narrowHeld(holder)
}

// narrowStaleCC narrows the list that a test process which ended without
// letting go (killed) left widened, unless a bed holds it (SweepStale).
func narrowStaleCC() error {
	mu, err := lockFile(ccMutex, unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer mu.Close()
	holder, err := lockFile(ccHolders, unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return nil
	} else if err != nil {
		return err
	}
	defer holder.Close()
	return narrowHeld(holder)
}

// narrowHeld takes the names the holders added out of the machine's list;
// holder is ccHolders, held exclusively.
func narrowHeld(holder *os.File) error {
	raw, err := os.ReadFile(ccHolders)
	if err != nil {
		return err
	}
	added := strings.Fields(string(raw))
	if len(added) == 0 {
		return nil
	}
	list, err := netnsutil.ReadSysctl("", allowedCC)
	if err != nil {
		return err
	}
	kept := slices.DeleteFunc(strings.Fields(list), func(n string) bool { return slices.Contains(added, n) })
	if err := netnsutil.WriteSysctl("", allowedCC, strings.Join(kept, " ")); err != nil {
		return fmt.Errorf("putting %s back to %q: %w", allowedCC, strings.Join(kept, " "), err)
	}
	return holder.Truncate(0)
}

// HoldAllowedCongestionControls keeps every bed from widening the machine's
// list while the caller checks what it refuses, and says whether it could:
// false while a bed holds the list widened (the caller then cannot tell
// which names the kernel refuses). A bed that starts meanwhile waits for
// release.
func HoldAllowedCongestionControls() (release func(), ok bool) {
	f, err := lockFile(ccHolders, unix.LOCK_EX|unix.LOCK_NB)
	if err != nil {
		return func() {}, false
	}
	return func() { _ = f.Close() }, true
}
