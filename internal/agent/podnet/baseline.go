package podnet

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"syscall"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// podMPTCPSysctls are the sysctls of a pod's namespace that Configure
// writes.
var podMPTCPSysctls = []string{"net.mptcp.enabled", "net.mptcp.path_manager", "net.mptcp.checksum_enabled", "net.ipv4.tcp_congestion_control"}

// podBaseline is what a pod's network namespace held before the agent first
// changed it: the MPTCP sysctls, the path manager's limits and endpoints.
// Releasing the pod (its policy withdrawn) and uninstalling put exactly this
// back, so a pod leaves the product as it came, whatever its runtime or an
// earlier tool had set (not the kernel's defaults, which it may never have
// had).
type podBaseline struct {
	// NetNS identifies the namespace the values were read from: a later
	// pod of the same name (a StatefulSet's) has another.
	NetNS netnsID `json:"netns"`
	// Sysctls by name; one the kernel lacks is left out.
	Sysctls   map[string]string  `json:"sysctls"`
	Limits    mptcpnl.Limits     `json:"limits"`
	Endpoints []mptcpnl.Endpoint `json:"endpoints,omitempty"`
}

// netnsID is a network namespace's identity: the device and inode of its
// file (nsfs), the same through every bind mount of it.
type netnsID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

func netnsIDOf(path string) (netnsID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return netnsID{}, err
	}
	return netnsID{Dev: st.Dev, Ino: st.Ino}, nil
}

// Baselines keeps each configured pod's baseline in
// <stateDir>/pods/<pod name>.json, so that a restarted or upgraded agent
// still knows them.
type Baselines struct{ dir string }

// NewBaselines keeps baselines under the agent's state directory.
func NewBaselines(stateDir string) Baselines {
	return Baselines{dir: filepath.Join(stateDir, "pods")}
}

func (b Baselines) path(pod string) string {
	return filepath.Join(b.dir, url.PathEscape(pod)+".json")
}

func (b Baselines) read(pod string) (podBaseline, bool) {
	var bl podBaseline
	raw, err := os.ReadFile(b.path(pod))
	if err != nil || json.Unmarshal(raw, &bl) != nil {
		return bl, false
	}
	return bl, true
}

// Has says whether pod's namespace has its baseline recorded.
func (b Baselines) Has(pod Pod) bool {
	bl, ok := b.read(pod.Name)
	if !ok {
		return false
	}
	id, err := netnsIDOf(pod.NetNS)
	return err == nil && id == bl.NetNS
}

// Record reads pod's baseline and keeps it, unless it is kept already:
// once the agent has configured a pod, what its namespace holds is the
// agent's doing.
func (b Baselines) Record(pod Pod) error {
	if b.Has(pod) {
		return nil
	}
	id, err := netnsIDOf(pod.NetNS)
	if err != nil {
		return err
	}
	bl := podBaseline{NetNS: id, Sysctls: map[string]string{}}
	for _, key := range podMPTCPSysctls {
		v, err := netnsutil.ReadSysctl(pod.NetNS, key)
		if errors.Is(err, fs.ErrNotExist) {
			continue // not in this kernel: never written either
		}
		if err != nil {
			return fmt.Errorf("reading %s before changing it: %w", key, err)
		}
		bl.Sysctls[key] = v
	}
	err = withPM(pod, func(c *mptcpnl.Conn) (err error) {
		if bl.Limits, err = c.GetLimits(); err != nil {
			return fmt.Errorf("reading the MPTCP limits before changing them: %w", err)
		}
		if bl.Endpoints, err = c.Endpoints(); err != nil {
			return fmt.Errorf("reading the MPTCP endpoints before changing them: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	raw, err := json.Marshal(bl)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(b.dir, 0o700); err != nil {
		return err
	}
	tmp := b.path(pod.Name) + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, b.path(pod.Name))
}

// Restore puts pod's baseline back and forgets it. ok is false when none is
// kept for the pod's current namespace (a pod configured by a release that
// kept no baselines): the caller decides what to write instead.
func (b Baselines) Restore(pod Pod) (ok bool, err error) {
	bl, found := b.read(pod.Name)
	if !found {
		return false, nil
	}
	if id, err := netnsIDOf(pod.NetNS); err != nil || id != bl.NetNS {
		// Another namespace under the same name: this baseline is of a
		// pod that is gone.
		return false, b.Forget(pod.Name)
	}
	var errs []error
	// The path manager first: the endpoints and limits below are then the
	// in-kernel path manager's again.
	for _, key := range podMPTCPSysctls {
		if v, ok := bl.Sysctls[key]; ok {
			errs = append(errs, netnsutil.WriteSysctl(pod.NetNS, key, v))
		}
	}
	errs = append(errs, withPM(pod, func(c *mptcpnl.Conn) error {
		if err := c.FlushEndpoints(); err != nil {
			return err
		}
		for _, e := range bl.Endpoints {
			if err := c.AddEndpoint(e); err != nil {
				return fmt.Errorf("endpoint %v id %d: %w", e.Addr, e.ID, err)
			}
		}
		return c.SetLimits(bl.Limits)
	}))
	if err := errors.Join(errs...); err != nil {
		return true, err
	}
	return true, b.Forget(pod.Name)
}

// Forget drops pod's baseline.
func (b Baselines) Forget(pod string) error {
	if err := os.Remove(b.path(pod)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
