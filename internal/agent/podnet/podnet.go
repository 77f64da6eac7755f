// Package podnet sets MPTCP up inside selected pods' network namespaces (the
// path manager, its limits and endpoints, DSS checksums) and runs the
// userspace path managers that open a pod's joins. It reads and writes
// nothing but the pods' namespaces.
package podnet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// Pod is a selected pod: its name (for logs), network namespace and
// addresses.
type Pod struct {
	Name  string
	NetNS string
	IPs   []netip.Addr
}

// Mode says who creates a connection's extra subflows.
type Mode string

const (
	// Userspace: the agent is the path manager of the pod's namespace and
	// opens joins itself from the pod's address (default).
	Userspace Mode = "userspace"
	// Signal: server pods announce one extra port per extra path;
	// clients' in-kernel path managers join them.
	Signal Mode = "signal"
	// None leaves the pod's MPTCP settings alone (VM guests and workloads
	// that manage their own subflows).
	None Mode = "none"
)

// MPTCP is what a pod's rule asks of its namespace.
type MPTCP struct {
	// Subflows says who creates a connection's extra subflows.
	Subflows Mode `json:"subflows,omitempty"`
	// Joins is how many extra subflows a connection gets: the rule's
	// paths and backup paths, up to its maximum, less the first.
	Joins int `json:"joins,omitempty"`
	// SignalPorts are, in signal mode, the extra ports the pods announce,
	// one per join: the rule is for servers. A signal-mode rule without
	// ports is for clients, which join what their peers announce.
	SignalPorts []uint16 `json:"signalPorts,omitempty"`
	// DataChecksums turns on DSS checksums in the pods
	// (net.mptcp.checksum_enabled).
	DataChecksums bool `json:"dataChecksums,omitempty"`
}

// maxKernelSubflows is the kernel's cap on subflows_max and add_addr_accepted.
const maxKernelSubflows = 8

// Configure makes subflows possible inside a pod's namespace as m asks. In
// userspace mode every pod accepts up to the kernel's limit of joins,
// because the peer's node decides how many it opens. In signal mode a server
// rule's pods announce one port per extra path, and every pod joins what its
// peers announce, up to one subflow per path in total. Pods that both
// announce and accept would open joins from both ends of one connection at
// once (docs/subflows.md): give servers and clients separate rules.
func Configure(pod Pod, m MPTCP) error {
	if m.Subflows == None {
		return nil
	}
	pm := "kernel"
	if m.Subflows == Userspace {
		pm = "userspace"
	}
	if err := netnsutil.WriteSysctl(pod.NetNS, "net.mptcp.enabled", "1"); err != nil {
		return err
	}
	if err := netnsutil.WriteSysctl(pod.NetNS, "net.mptcp.path_manager", pm); err != nil {
		return err
	}
	if err := netnsutil.WriteSysctl(pod.NetNS, "net.mptcp.checksum_enabled", boolSysctl(m.DataChecksums)); err != nil {
		return err
	}
	return withPM(pod, func(c *mptcpnl.Conn) error {
		if err := c.FlushEndpoints(); err != nil {
			return fmt.Errorf("flushing endpoints: %w", err)
		}
		limits := mptcpnl.Limits{Subflows: maxKernelSubflows}
		if m.Subflows == Signal {
			limits.Subflows = uint32(m.Joins)
			limits.AddAddrAccepted = uint32(m.Joins)
			// One signal endpoint per extra path: the kernel listens on
			// the port and announces it to every peer.
			for i := 0; i < m.Joins && i < len(m.SignalPorts); i++ {
				for _, ip := range pod.IPs {
					ep := mptcpnl.Endpoint{Addr: ip, ID: uint8(i + 1), Port: m.SignalPorts[i], Flags: mptcpnl.FlagSignal}
					if err := c.AddEndpoint(ep); err != nil {
						return fmt.Errorf("signal endpoint %v port %d: %w", ip, ep.Port, err)
					}
				}
			}
		}
		return c.SetLimits(limits)
	})
}

func boolSysctl(on bool) string {
	if on {
		return "1"
	}
	return "0"
}

// Reset undoes Configure: the kernel's path manager and default limits, no
// endpoints, no checksums (a released pod, uninstall, a pod whose rule now
// leaves its stack alone).
func Reset(pod Pod) error {
	if err := netnsutil.WriteSysctl(pod.NetNS, "net.mptcp.path_manager", "kernel"); err != nil {
		return err
	}
	if err := netnsutil.WriteSysctl(pod.NetNS, "net.mptcp.checksum_enabled", "0"); err != nil {
		return err
	}
	return withPM(pod, func(c *mptcpnl.Conn) error {
		if err := c.FlushEndpoints(); err != nil {
			return err
		}
		return c.SetLimits(mptcpnl.Limits{Subflows: 2}) // the kernel's default
	})
}

func withPM(pod Pod, fn func(*mptcpnl.Conn) error) error {
	c, err := dial(pod)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(c)
}

func dial(pod Pod) (*mptcpnl.Conn, error) {
	fd, err := netnsutil.Open(pod.NetNS)
	if err != nil {
		return nil, err
	}
	defer func() { _ = unix.Close(fd) }()
	return mptcpnl.Dial(fd)
}

// PathManagers are the userspace path managers of the node's pods, one per
// pod whose rule has the agent open its joins.
type PathManagers struct {
	log *slog.Logger
	m   map[string]*pathManager // by pod name
}

// NewPathManagers makes an empty set.
func NewPathManagers(log *slog.Logger) *PathManagers {
	return &PathManagers{log: log, m: map[string]*pathManager{}}
}

// Want is a pod that needs a path manager, and the joins it opens per
// connection.
type Want struct {
	Pod   Pod
	Joins int
}

// Sync runs a path manager for each pod of want and none for the others. A
// running one takes its pod's join count as it is now, so a changed rule
// reaches the pod's next connection without a restart.
func (p *PathManagers) Sync(ctx context.Context, want []Want) error {
	var errs []error
	wanted := map[string]bool{}
	for _, w := range want {
		wanted[w.Pod.Name] = true
		if pm := p.m[w.Pod.Name]; pm != nil {
			pm.joins.Store(int32(w.Joins))
			continue
		}
		pm, err := start(ctx, w.Pod, w.Joins, p.log)
		if err != nil {
			errs = append(errs, fmt.Errorf("pod %s: path manager: %w", w.Pod.Name, err))
			continue
		}
		p.m[w.Pod.Name] = pm
	}
	for _, name := range slices.Sorted(maps.Keys(p.m)) {
		if !wanted[name] {
			p.m[name].stop()
			delete(p.m, name)
		}
	}
	return errors.Join(errs...)
}

// Stop stops every path manager.
func (p *PathManagers) Stop() {
	for name, pm := range p.m {
		pm.stop()
		delete(p.m, name)
	}
}

// Len is how many run.
func (p *PathManagers) Len() int { return len(p.m) }

// Joins is how many joins pod's path manager opens per connection; ok is
// false when it has none.
func (p *PathManagers) Joins(pod string) (n int, ok bool) {
	pm := p.m[pod]
	if pm == nil {
		return 0, false
	}
	return int(pm.joins.Load()), true
}

// pathManager is the userspace path manager of one pod: when a connection
// the pod opened is established, it opens the rule's joins from the same
// local address to the same remote address and port. The datapath then
// places each join on its own path.
type pathManager struct {
	pod Pod
	// joins is how many joins a connection gets; Sync changes it while
	// the path manager runs.
	joins  atomic.Int32
	log    *slog.Logger
	events *mptcpnl.Conn
	cmds   *mptcpnl.Conn
	cancel context.CancelFunc
	done   chan struct{}
}

func start(ctx context.Context, pod Pod, joins int, log *slog.Logger) (*pathManager, error) {
	events, err := dial(pod)
	if err != nil {
		return nil, err
	}
	if err := events.SubscribeEvents(); err != nil {
		events.Close()
		return nil, err
	}
	cmds, err := dial(pod)
	if err != nil {
		events.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &pathManager{pod: pod, log: log.With("pod", pod.Name), events: events, cmds: cmds, cancel: cancel, done: make(chan struct{})}
	s.joins.Store(int32(joins))
	go func() {
		<-ctx.Done()
		// Closing the socket ends the blocked Receive.
		events.Close()
	}()
	go s.run(ctx)
	return s, nil
}

func (s *pathManager) run(ctx context.Context) {
	defer close(s.done)
	defer s.cmds.Close()
	for {
		evs, err := s.events.Receive()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.Error("reading MPTCP events", "err", err)
			return
		}
		for _, ev := range evs {
			if ev.Type != mptcpnl.EventEstablished || ev.ServerSide {
				continue
			}
			s.openJoins(ev.Token, ev.Local.Addr(), ev.Remote)
		}
	}
}

func (s *pathManager) openJoins(token uint32, local netip.Addr, remote netip.AddrPort) {
	joins := int(s.joins.Load())
	for i := 0; i < joins; i++ {
		// Local id 1 names the pod's own address for joins; the initial
		// subflow's address keeps id 0.
		if err := s.cmds.CreateSubflow(token, local, 1, remote); err != nil {
			s.log.Warn("opening join", "remote", remote, "err", err)
			return
		}
	}
	s.log.Debug("opened joins", "remote", remote, "joins", joins)
}

func (s *pathManager) stop() {
	s.cancel()
	<-s.done
}
