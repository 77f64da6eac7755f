package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// Agent enforces one node's configuration.
type Agent struct {
	log      *slog.Logger
	cfg      *Config
	dp       *datapath.Datapath
	creators map[string]*subflowCreator // by pod name
	// previous is the last configuration reconciled (at start: the one a
	// previous process applied, from status.json), so that pods it
	// selected and the next one does not get their settings back.
	previous *Config

	// ruleIDs maps rule names to datapath ids (ruleids.go); adopt says
	// it was not found in the state directory: the first reconcile takes
	// the ids the pinned endpoints already use.
	ruleIDs *ruleIDs
	adopt   bool

	// What scrapes read while a reconcile runs: the names of the paths
	// in force by index, and how many path managers run.
	paths atomic.Pointer[map[uint32]string]
	// ruleNames are the rules by datapath id (retired ones that live
	// connections still use included), for the local API.
	ruleNames atomic.Pointer[map[uint32]string]
	// pods are the pods in force, for their MPTCP counters.
	pods         atomic.Pointer[[]Pod]
	pathManagers atomic.Int64
}

// New loads (or re-adopts, from pins) the datapath for cfg.
func New(cfg *Config, log *slog.Logger) (*Agent, error) {
	if err := ensureBPFFS(); err != nil {
		return nil, err
	}
	// Migrate: pinned maps an earlier release laid out differently are
	// converted now and settled by FinishMigration after the first reconcile.
	dp, err := datapath.Load(datapath.Options{PinDir: cfg.PinDir, MarkMask: cfg.MarkMask, Migrate: true, Log: log})
	if err != nil {
		return nil, err
	}
	a := &Agent{log: log, cfg: cfg, dp: dp, creators: map[string]*subflowCreator{}}
	if st, err := readStatus(cfg.StateDir); err == nil {
		a.previous = st.Applied
	}
	var found bool
	a.ruleIDs, found = readRuleIDs(cfg.StateDir)
	a.adopt = !found
	a.setPaths(cfg)
	return a, nil
}

func (a *Agent) setPaths(cfg *Config) {
	names := make(map[uint32]string, len(cfg.Paths))
	for _, p := range cfg.Paths {
		names[p.Index] = p.Name
	}
	a.paths.Store(&names)
	rules := map[uint32]string{}
	if a.ruleIDs != nil {
		rules = a.ruleIDs.names()
	}
	a.ruleNames.Store(&rules)
	pods := slices.Clone(cfg.Pods)
	a.pods.Store(&pods)
}

// pathNames returns the configured paths' names by index.
func (a *Agent) pathNames() map[uint32]string { return *a.paths.Load() }

// Close stops the agent's goroutines and releases file descriptors. What is
// pinned stays: the datapath keeps steering while no agent runs.
func (a *Agent) Close() error {
	a.stopCreators()
	return a.dp.Close()
}

func (a *Agent) stopCreators() {
	for name, c := range a.creators {
		c.stop()
		delete(a.creators, name)
	}
	a.pathManagers.Store(0)
}

// Datapath exposes the loaded datapath (stats, tables).
func (a *Agent) Datapath() *datapath.Datapath { return a.dp }

// Reconcile makes the node match cfg. On error the parts that succeeded stay
// applied; the caller reports the error and keeps running.
func (a *Agent) Reconcile(ctx context.Context, cfg *Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration, keeping the last one in force: %w", err)
	}
	var errs []error
	paths := map[string]Path{}
	for _, p := range cfg.Paths {
		paths[p.Name] = p
	}

	// The switch first: a node set up in observe-only mode never marks a
	// packet, not even between the first attach and the end of this
	// reconcile. Switching it off marks again at once, with the programs
	// in place.
	if err := a.dp.SetObserveOnly(cfg.ObserveOnly); err != nil {
		return fmt.Errorf("observe-only: %w", err)
	}

	// Routing first: a mark without its rule would send packets nowhere.
	plan, err := planRouting(cfg, a.dp.Mark)
	if err != nil {
		return err
	}
	if err := plan.apply(); err != nil {
		errs = append(errs, err)
	}
	if err := a.saveAndSetSysctls(cfg); err != nil {
		errs = append(errs, err)
	}

	wantAttach := map[datapath.Attachment]bool{}
	for _, p := range cfg.Paths {
		iface, err := net.InterfaceByName(p.Interface)
		if err != nil {
			errs = append(errs, fmt.Errorf("path %q: %w", p.Name, err))
			// No NIC: spread must not place new subflows on the path.
			if err := a.dp.SetPathDown(p.Index, true); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := a.dp.SetNIC(iface.Index, p.Index); err != nil {
			errs = append(errs, err)
		}
		// A NIC without carrier (not RUNNING) is down for placement, as
		// seen at this reconcile; liveness probes will set it too.
		if err := a.dp.SetPathDown(p.Index, iface.Flags&net.FlagRunning == 0); err != nil {
			errs = append(errs, err)
		}
		wantAttach[datapath.Attachment{Interface: p.Interface, Hook: datapath.HookNICIngress}] = true
	}

	// Each rule under its id (ruleids.go): written before any pod points
	// at it, and in place when its name already had the id.
	rules, err := a.assignRuleIDs(cfg)
	if err != nil {
		errs = append(errs, err)
	}
	ruleByName := map[string]Rule{}
	for _, r := range cfg.Rules {
		ruleByName[r.Name] = r
		id, ok := rules[r.Name]
		if !ok {
			continue
		}
		dr, err := r.datapathRule(paths)
		if err == nil {
			err = a.dp.SetRule(id, dr)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rule %q: %w", r.Name, err))
		}
	}

	if err := a.applyRates(cfg, paths, rules); err != nil {
		errs = append(errs, err)
	}
	if err := a.applyShaping(cfg, paths, rules, wantAttach); err != nil {
		errs = append(errs, err)
	}

	wantEndpoints := map[string]bool{}
	wantCreators := map[string]bool{}
	for _, pod := range cfg.Pods {
		// The pod's MPTCP settings and subflow creation follow its first
		// (highest priority) rule; the datapath selects per subflow.
		rule := ruleByName[pod.ruleNames()[0]]
		ids := make([]uint32, 0, len(pod.ruleNames()))
		for _, name := range pod.ruleNames() {
			if id, ok := rules[name]; ok {
				ids = append(ids, id)
			}
		}
		if len(ids) != len(pod.ruleNames()) {
			errs = append(errs, fmt.Errorf("pod %s: a rule of its chain has no id", pod.Name))
			continue
		}
		if err := a.configurePod(pod, rule); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", pod.Name, err))
			continue
		}
		if rule.Subflows == SubflowsUserspace && rule.joins() > 0 {
			wantCreators[pod.Name] = true
			if c := a.creators[pod.Name]; c != nil {
				// A running path manager takes the rule as it is now:
				// the next connection gets the joins it asks for.
				c.setJoins(rule.joins())
			} else {
				c, err := startSubflowCreator(ctx, pod, rule, a.log)
				if err != nil {
					errs = append(errs, fmt.Errorf("pod %s: path manager: %w", pod.Name, err))
				} else {
					a.creators[pod.Name] = c
				}
			}
		}
		for _, ip := range pod.IPs {
			if err := a.dp.SetEndpointRules(ip, ids...); err != nil {
				errs = append(errs, err)
			}
			wantEndpoints[ip.String()] = true
		}
		wantAttach[datapath.Attachment{Interface: pod.HostInterface, Hook: datapath.HookPodEgress}] = true
		wantAttach[datapath.Attachment{Interface: pod.HostInterface, Hook: datapath.HookPodIngress}] = true
	}

	for att := range wantAttach {
		if err := a.dp.Attach(att); err != nil {
			errs = append(errs, err)
		}
	}

	// Then collect what no configuration wants any more.
	for name, c := range a.creators {
		if !wantCreators[name] {
			c.stop()
			delete(a.creators, name)
		}
	}
	if err := a.releasePods(cfg); err != nil {
		errs = append(errs, err)
	}
	eps, err := a.dp.Endpoints()
	if err != nil {
		errs = append(errs, err)
	}
	for addr := range eps {
		if !wantEndpoints[addr.String()] {
			if err := a.dp.DeleteEndpoint(addr); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := a.sweepReleased(cfg); err != nil {
		errs = append(errs, err)
	}
	if err := a.retireRules(cfg, rules); err != nil {
		errs = append(errs, err)
	}
	atts, err := a.dp.Attachments()
	if err != nil {
		errs = append(errs, err)
	}
	for _, att := range atts {
		if !wantAttach[att] {
			if err := a.dp.Detach(att); err != nil {
				errs = append(errs, err)
			}
		}
	}
	a.pathManagers.Store(int64(len(a.creators)))
	a.cfg, a.previous = cfg, cfg
	a.setPaths(cfg)
	return errors.Join(errs...)
}

// assignRuleIDs gives each rule of cfg its datapath id (ruleids.go).
func (a *Agent) assignRuleIDs(cfg *Config) (map[string]uint32, error) {
	live, err := liveRuleIDs(a.dp)
	if err != nil {
		return nil, fmt.Errorf("reading the rule ids live connections use: %w", err)
	}
	var adopt map[string]uint32
	if a.adopt {
		adopt = adoptedRuleIDs(a.dp, cfg)
	}
	want := make([]string, 0, len(cfg.Rules))
	for _, r := range cfg.Rules {
		want = append(want, r.Name)
	}
	ids, err := a.ruleIDs.assign(want, adopt, live)
	if werr := a.ruleIDs.write(cfg.StateDir); werr != nil {
		err = errors.Join(err, fmt.Errorf("keeping the rule ids: %w", werr))
	}
	a.adopt = false
	return ids, err
}

// retireRules frees the ids of rules cfg no longer has once no live
// subflow or connection uses them (their closed ones forgotten first), and
// clears their datapath entries; until then a retired rule's entries stay
// as they were, so its connections keep its paths and caps.
func (a *Agent) retireRules(cfg *Config, current map[string]uint32) error {
	ids := map[uint32]bool{}
	want := map[string]bool{}
	for name, id := range current {
		ids[id], want[name] = true, true
	}
	err := a.sweepRetiredRules(cfg, ids)
	live, lerr := liveRuleIDs(a.dp)
	if lerr != nil {
		return errors.Join(err, lerr)
	}
	errs := []error{err}
	for _, id := range a.ruleIDs.retire(want, live) {
		errs = append(errs, a.dp.DeleteRule(id), a.dp.ClearRateRule(id))
	}
	if werr := a.ruleIDs.write(cfg.StateDir); werr != nil {
		errs = append(errs, fmt.Errorf("keeping the rule ids: %w", werr))
	}
	return errors.Join(errs...)
}

// configurePod sets the pod's MPTCP up as rule asks, at every reconcile, so a
// changed rule reaches a running pod. A pod whose rule now leaves its stack
// alone (subflows none: a guest's own path manager) after the agent set it
// up gets the kernel's path manager and default limits back, as a released
// pod does.
func (a *Agent) configurePod(pod Pod, rule Rule) error {
	if rule.Subflows == SubflowsNone && a.previous != nil {
		for _, p := range a.previous.Pods {
			if p.Name != pod.Name || len(p.ruleNames()) == 0 {
				continue
			}
			if prev := a.previous.rule(p.ruleNames()[0]); prev != nil && prev.Subflows != SubflowsNone {
				return resetPodMPTCP(pod)
			}
		}
	}
	return configurePodMPTCP(pod, rule)
}

// releasePods gives the pods that the previous configuration selected and
// cfg does not the kernel's path manager and default limits back, as
// uninstall does. A pod whose namespace is gone (deleted) needs nothing.
func (a *Agent) releasePods(cfg *Config) error {
	if a.previous == nil {
		return nil
	}
	keep := map[string]bool{}
	for _, p := range cfg.Pods {
		keep[p.Name] = true
	}
	modes := map[string]SubflowMode{}
	for _, r := range a.previous.Rules {
		modes[r.Name] = r.Subflows
	}
	var errs []error
	for _, pod := range a.previous.Pods {
		if keep[pod.Name] || len(pod.ruleNames()) == 0 || modes[pod.ruleNames()[0]] == SubflowsNone {
			continue
		}
		if _, err := os.Stat(pod.NetNS); err != nil {
			continue
		}
		if err := resetPodMPTCP(pod); err != nil {
			errs = append(errs, fmt.Errorf("pod %s (no longer selected): %w", pod.Name, err))
		}
	}
	return errors.Join(errs...)
}

// sysctlState records the values the agent changed, so uninstall can put
// them back.
type sysctlState struct {
	Original map[string]string `json:"original"`
}

func (a *Agent) statePath() string { return filepath.Join(a.cfg.StateDir, "sysctl.json") }

// saveAndSetSysctls enables src_valid_mark on every path NIC: with strict
// reverse-path filtering, the check for a packet arriving on NIC k then uses
// the mark its NIC gave it, finds path k's table and accepts the packet.
func (a *Agent) saveAndSetSysctls(cfg *Config) error {
	st := sysctlState{Original: map[string]string{}}
	if b, err := os.ReadFile(a.statePath()); err == nil {
		_ = json.Unmarshal(b, &st)
	}
	var errs []error
	for _, p := range cfg.Paths {
		key := "net.ipv4.conf." + p.Interface + ".src_valid_mark"
		if _, saved := st.Original[key]; !saved {
			v, err := netnsutil.ReadSysctl("", key)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			st.Original[key] = v
		}
		if err := netnsutil.WriteSysctl("", key, "1"); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return err
	}
	b, _ := json.Marshal(st)
	if err := os.WriteFile(a.statePath(), b, 0o600); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Uninstall removes everything the agent created on this node: links, maps,
// pins, rules, tables, sysctls and the pods' MPTCP settings.
func (a *Agent) Uninstall() error {
	a.stopCreators()
	var errs []error
	atts, err := a.dp.Attachments()
	if err != nil {
		errs = append(errs, err)
	}
	for _, att := range atts {
		if err := a.dp.Detach(att); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeRouting(a.cfg); err != nil {
		errs = append(errs, err)
	}
	// In kube mode a.cfg holds the node-local settings only: the paths and
	// pods are those of the configuration last applied (status.json).
	last := a.cfg
	if a.previous != nil {
		last = &Config{Paths: append(slices.Clone(a.cfg.Paths), a.previous.Paths...),
			Pods: append(slices.Clone(a.cfg.Pods), a.previous.Pods...)}
	}
	if err := removeShaping(last); err != nil {
		errs = append(errs, err)
	}
	for _, pod := range last.Pods {
		if _, err := os.Stat(pod.NetNS); err == nil {
			if err := resetPodMPTCP(pod); err != nil {
				errs = append(errs, fmt.Errorf("pod %s: %w", pod.Name, err))
			}
		}
	}
	if b, err := os.ReadFile(a.statePath()); err == nil {
		var st sysctlState
		if json.Unmarshal(b, &st) == nil {
			keys := make([]string, 0, len(st.Original))
			for k := range st.Original {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				// The interface may be gone; nothing to restore then.
				_ = netnsutil.WriteSysctl("", k, st.Original[k])
			}
		}
	}
	if err := os.RemoveAll(a.cfg.StateDir); err != nil {
		errs = append(errs, err)
	}
	if err := a.dp.Unpin(); err != nil {
		errs = append(errs, err)
	}
	if err := a.dp.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(a.cfg.PinDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ensureBPFFS mounts bpffs at /sys/fs/bpf if nothing is mounted there, as
// Cilium's agent does: pins need it.
func ensureBPFFS() error {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll("/sys/fs/bpf", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mounting bpffs at /sys/fs/bpf: %w", err)
	}
	return nil
}

// Status is what the agent last did, written to <StateDir>/status.json for
// tools and tests until the API's MPTCPNodeState status takes over.
type Status struct {
	// PID is the agent process that wrote the status; Reconciles counts
	// that process's reconciles.
	PID        int    `json:"pid"`
	Reconciles int    `json:"reconciles"`
	Error      string `json:"error,omitempty"`
	// Applied is the configuration in force (the last good one).
	Applied *Config `json:"applied,omitempty"`
	// MetricsAddress is where /metrics, /healthz and /readyz are served
	// (the address actually bound, when the flag asked for port 0).
	MetricsAddress string `json:"metricsAddress,omitempty"`
	// LocalAPISocket is the unix socket of the local API (root only).
	LocalAPISocket string `json:"localAPISocket,omitempty"`
}

func readStatus(stateDir string) (Status, error) {
	var st Status
	b, err := os.ReadFile(filepath.Join(stateDir, "status.json"))
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

// WriteStatus records the outcome of a reconcile.
func (a *Agent) WriteStatus(st Status) error {
	if err := os.MkdirAll(a.cfg.StateDir, 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(a.cfg.StateDir, ".status.json")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(a.cfg.StateDir, "status.json"))
}
