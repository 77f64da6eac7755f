// Package podnet sets MPTCP up inside selected pods' network namespaces (the
// path manager, its limits and endpoints, DSS checksums, the TCP congestion
// control) and runs the userspace path managers that open a pod's joins. It
// reads and writes nothing but the pods' namespaces, and the node's list of
// the congestion controls namespaces may take (allowNodeWide).
package podnet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// Pod is a selected pod: its name (for logs and metrics), UID, network
// namespace and addresses.
type Pod struct {
	Name string
	// UID is the pod's in the API; empty where the agent runs without one
	// (a node state from a file).
	UID   string
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
	// JoinAfterBytes is, in userspace mode, how many bytes a connection
	// carries, both ways, before the path manager opens its joins; 0: at
	// once.
	JoinAfterBytes uint64 `json:"joinAfterBytes,omitempty"`
	// CongestionControl is the TCP congestion control of the pods'
	// namespaces (net.ipv4.tcp_congestion_control); empty leaves theirs.
	CongestionControl string `json:"congestionControl,omitempty"`
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
	// First: a congestion control refused leaves the pod as it was.
	if err := setCongestionControl(pod, m.CongestionControl); err != nil {
		return err
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
		if err := syncEndpoints(c, signalEndpoints(pod, m)); err != nil {
			return err
		}
		limits := mptcpnl.Limits{Subflows: maxKernelSubflows}
		if m.Subflows == Signal {
			limits.Subflows = uint32(m.Joins)
			limits.AddAddrAccepted = uint32(m.Joins)
		}
		return c.SetLimits(limits)
	})
}

// signalEndpoints are the endpoints m asks of pod: in signal mode, one per
// extra path and pod address, each announcing its port (the kernel listens
// on it and announces it to every peer); none otherwise. The kernel gives
// them their ids.
func signalEndpoints(pod Pod, m MPTCP) []mptcpnl.Endpoint {
	if m.Subflows != Signal {
		return nil
	}
	var out []mptcpnl.Endpoint
	for i := 0; i < m.Joins && i < len(m.SignalPorts); i++ {
		for _, ip := range pod.IPs {
			out = append(out, mptcpnl.Endpoint{Addr: ip.Unmap(), Port: m.SignalPorts[i], Flags: mptcpnl.FlagSignal})
		}
	}
	return out
}

// syncEndpoints gives the namespace the endpoints want, touching only those
// that differ (by address, port, flags and interface: ids are the kernel's
// to give), at every reconcile. Removing an endpoint withdraws it from
// every connection (RM_ADDR), and a server's cannot be added back while
// joins to its port live (they hold the port: EADDRINUSE), so removing and
// adding them all again would leave a busy server pod with none
// (docs/subflows.md, "Signal mode and closed joins"). Endpoints the kernel
// made itself (implicit) are its own and stay. One endpoint that fails
// does not keep the others from being set.
func syncEndpoints(c *mptcpnl.Conn, want []mptcpnl.Endpoint) error {
	have, err := c.Endpoints()
	if err != nil {
		return fmt.Errorf("listing endpoints: %w", err)
	}
	var errs []error
	kept := make([]bool, len(want))
	for _, e := range have {
		if e.Flags&mptcpnl.FlagImplicit != 0 {
			continue
		}
		if i := slices.IndexFunc(want, func(w mptcpnl.Endpoint) bool { return sameEndpoint(w, e) }); i >= 0 && !kept[i] {
			kept[i] = true
			continue
		}
		if err := c.DeleteEndpoint(e.ID); err != nil {
			errs = append(errs, fmt.Errorf("removing endpoint %d (%v port %d): %w", e.ID, e.Addr, e.Port, err))
		}
	}
	for i, w := range want {
		if kept[i] {
			continue
		}
		if err := c.AddEndpoint(w); err != nil {
			errs = append(errs, fmt.Errorf("signal endpoint %v port %d: %w", w.Addr, w.Port, err))
		}
	}
	return errors.Join(errs...)
}

// sameEndpoint says whether a and b are one endpoint, whatever their ids.
func sameEndpoint(a, b mptcpnl.Endpoint) bool {
	return a.Addr.Unmap() == b.Addr.Unmap() && a.Port == b.Port && a.Flags == b.Flags && a.IfIndex == b.IfIndex
}

// setCongestionControl makes name the pod namespace's TCP congestion
// control; "" leaves it. The kernel gives a namespace other than the
// node's own only an algorithm it has (tcp_available_congestion_control,
// read first so that the agent never makes the kernel load a module) and
// allows unprivileged (tcp_allowed_congestion_control: reno and the
// kernel's built-in default, at first): one it has and does not allow, the
// agent adds to that list (allowNodeWide). One it lacks, or cannot allow,
// is refused with what to change on the node.
func setCongestionControl(pod Pod, name string) error {
	const key = "net.ipv4.tcp_congestion_control"
	if name == "" {
		return nil
	}
	if cur, err := netnsutil.ReadSysctl(pod.NetNS, key); err == nil && cur == name {
		return nil
	}
	avail, err := netnsutil.ReadSysctl(pod.NetNS, "net.ipv4.tcp_available_congestion_control")
	if err != nil {
		return err
	}
	if !slices.Contains(strings.Fields(avail), name) {
		return fmt.Errorf("congestion control %q is not on the node (net.ipv4.tcp_available_congestion_control: %s); "+
			"load its module on the node or set podMPTCP.congestionControl to one of those", name, avail)
	}
	err = netnsutil.WriteSysctl(pod.NetNS, key, name)
	if !errors.Is(err, unix.EPERM) {
		return err
	}
	if aerr := allowNodeWide(name); aerr != nil {
		allowed, _ := netnsutil.ReadSysctl(pod.NetNS, allowedCongestionControls)
		return fmt.Errorf("congestion control %q is on the node but not allowed in pods' namespaces "+
			"(net.ipv4.tcp_allowed_congestion_control: %s) and the agent cannot add it (%w); "+
			"run the agent in the node's network namespace (hostNetwork), add it there on the node, "+
			"or set podMPTCP.congestionControl to one of those", name, allowed, aerr)
	}
	return netnsutil.WriteSysctl(pod.NetNS, key, name)
}

// allowedCongestionControls is the node's one list of the congestion
// controls that namespaces other than its own may take: a global sysctl,
// which only a process in the node's own namespace may write.
const allowedCongestionControls = "net.ipv4.tcp_allowed_congestion_control"

// allowListMu makes reading and extending the node's list one step.
var allowListMu sync.Mutex

// allowNodeWide adds name to the node's list, as an admin would to let pods
// take it, from the agent's own network namespace: the node's with
// hostNetwork; any other refuses the write. The list keeps it after the
// agent goes, as it keeps anything an admin adds: another pod may be using
// it by then.
func allowNodeWide(name string) error {
	allowListMu.Lock()
	defer allowListMu.Unlock()
	list, err := netnsutil.ReadSysctl("", allowedCongestionControls)
	if err != nil {
		return err
	}
	if slices.Contains(strings.Fields(list), name) {
		return nil
	}
	return netnsutil.WriteSysctl("", allowedCongestionControls, strings.TrimSpace(list)+" "+name)
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
// pod whose rule has the agent open its joins. Sync and Stop change the set
// while scrapes read it (States).
type PathManagers struct {
	log     *slog.Logger
	backoff backoff
	opts    PathManagerOptions
	mu      sync.Mutex
	m       map[podKey]*pathManager
	// down are the paths down (PathDown until PathBack), for the path
	// managers started meanwhile.
	down map[uint32]bool
	// listings are the node's listing slots, which every path manager
	// shares (listing.go).
	listings chan struct{}
}

// podKey is a pod's identity for its path manager: its UID and its network
// namespace. Not its name: a StatefulSet's re-created pod has the same name
// and a new namespace, and a path manager of the old one would listen where
// no connection of the pod is ever opened again. The UID keeps apart two
// namespaces that got the same inode one after the other.
type podKey struct {
	uid   string
	netns netnsID
}

func keyOf(pod Pod) (podKey, error) {
	id, err := netnsIDOf(pod.NetNS)
	if err != nil {
		return podKey{}, fmt.Errorf("network namespace: %w", err)
	}
	return podKey{uid: pod.UID, netns: id}, nil
}

// backoff is how long a path manager that stopped waits before it starts
// again: Min after a stop, doubled after each failed start up to Max, and
// Min again once it has run for Healthy.
type backoff struct {
	Min, Max, Healthy time.Duration
}

// defaultBackoff retries a failed path manager at once (connections opened
// meanwhile get no joins), and no more than twice a minute while its
// namespace refuses.
var defaultBackoff = backoff{Min: 100 * time.Millisecond, Max: 30 * time.Second, Healthy: time.Minute}

// PathManagerOptions are what every path manager of a node shares.
type PathManagerOptions struct {
	// SubflowClosed, when not nil, hears of every subflow a managed pod's
	// kernel closes (the 4-tuple as the pod sends it, the connection's
	// token as the kernel named it) and when it heard of it, before a
	// join replaces it: the datapath gives the subflow's path back to its
	// connection there, and returns that path (0: it had none), which the
	// replacement waits for while it is down.
	SubflowClosed func(local, remote netip.AddrPort, token uint32, heard time.Time) (path uint32, err error)
	// ClosedEntryGrace is how long after a connection's close its
	// subflows' entries may go, their sockets gone (connclose.go); 0:
	// DefaultClosedEntryGrace.
	ClosedEntryGrace time.Duration
	// JoinHoldoff, when positive, opens every join as a backup subflow
	// and makes it active that long after it is established, or later
	// when the peer has not answered its handshake by half that: so that
	// the peer has taken the join into its connection before data reaches
	// it (holdoff.go). 0 opens joins active.
	JoinHoldoff time.Duration
}

// DefaultClosedEntryGrace keeps a closed connection's entries 10 s: a pod
// that opens 400 short connections a second stays within its share of the
// subflow table (4096), and a connection that just ended can still be read
// from the tables.
const DefaultClosedEntryGrace = 10 * time.Second

// NewPathManagers makes an empty set.
func NewPathManagers(log *slog.Logger, opts PathManagerOptions) *PathManagers {
	return &PathManagers{log: log, backoff: defaultBackoff, opts: opts, m: map[podKey]*pathManager{}, listings: make(chan struct{}, maxListings)}
}

// Want is a pod that needs a path manager, and the joins it opens per
// connection.
type Want struct {
	Pod   Pod
	Joins int
	// JoinAfterBytes is how many bytes a connection carries, both ways,
	// before its joins are opened; 0: at once.
	JoinAfterBytes uint64
}

// Sync runs a path manager for each pod of want and none for the others. A
// running one takes its pod's join count and threshold as they are now, so a changed rule
// reaches the pod's next connection without a restart. A pod whose
// namespace changed under the same name is another pod: its old path
// manager stops and a new one listens in the new namespace. The pods whose
// path manager could not start are returned, by name, with why: each is its
// pod's problem, not the node's.
func (p *PathManagers) Sync(ctx context.Context, want []Want) map[string]error {
	errs := map[string]error{}
	var unwanted []*pathManager
	p.mu.Lock()
	wanted := map[podKey]bool{}
	for _, w := range want {
		key, err := keyOf(w.Pod)
		if err != nil {
			errs[w.Pod.Name] = fmt.Errorf("path manager: %w", err)
			continue
		}
		wanted[key] = true
		if pm := p.m[key]; pm != nil {
			pm.joins.Store(int32(w.Joins))
			pm.joinAfter.Store(w.JoinAfterBytes)
			continue
		}
		pm, err := start(ctx, w, key, p.backoff, p.log, p.opts, p.listings)
		if err != nil {
			errs[w.Pod.Name] = fmt.Errorf("path manager: %w", err)
			continue
		}
		for path := range p.down {
			pm.markDown(path)
		}
		p.m[key] = pm
	}
	for key, pm := range p.m {
		if !wanted[key] {
			unwanted = append(unwanted, pm)
			delete(p.m, key)
		}
	}
	p.mu.Unlock()
	// Outside the lock: scrapes need not wait for the goroutines to end.
	for _, pm := range unwanted {
		pm.stop()
	}
	if len(errs) == 0 {
		return nil
	}
	return errs
}

// Stop stops every path manager.
func (p *PathManagers) Stop() {
	p.mu.Lock()
	all := slices.Collect(maps.Values(p.m))
	clear(p.m)
	p.mu.Unlock()
	for _, pm := range all {
		pm.stop()
	}
}

// Len is how many there are, up or down.
func (p *PathManagers) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}

// Joins is how many joins pod's path manager opens per connection; ok is
// false when the pod (its UID and namespace) has none.
func (p *PathManagers) Joins(pod Pod) (n int, ok bool) {
	pm := p.get(pod)
	if pm == nil {
		return 0, false
	}
	return int(pm.joins.Load()), true
}

func (p *PathManagers) get(pod Pod) *pathManager {
	key, err := keyOf(pod)
	if err != nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[key]
}

// PathManagerState is one path manager as the agent's observers see it.
type PathManagerState struct {
	// Pod is the pod's name.
	Pod string
	// Up says it listens to the pod's events; false while it waits to
	// start again after it stopped.
	Up bool
	// Restarts counts the times it stopped without being asked to (its
	// event socket failed) and had to start again.
	Restarts uint64
	// ReplacedJoins counts the joins it opened to replace subflows the
	// pod's kernel closed.
	ReplacedJoins uint64
	// ReleasedJoins counts the joins it opened held as backup and made
	// active after the hold (holdoff.go).
	ReleasedJoins uint64
	// LeftSubflows counts the subflows it closed because their path went
	// down while they recovered from losses (leave.go).
	LeftSubflows uint64
}

// States are the path managers' states, sorted by pod name.
func (p *PathManagers) States() []PathManagerState {
	p.mu.Lock()
	out := make([]PathManagerState, 0, len(p.m))
	for _, pm := range p.m {
		out = append(out, PathManagerState{Pod: pm.pod.Name, Up: pm.up.Load(), Restarts: pm.restarts.Load(), ReplacedJoins: pm.replacedJoins.Load(),
			ReleasedJoins: pm.releasedJoins.Load(), LeftSubflows: pm.leftSubflows.Load()})
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b PathManagerState) int { return cmp.Compare(a.Pod, b.Pod) })
	return out
}

// pathManager is the userspace path manager of one pod: when a connection
// the pod opened is established, it opens the rule's joins from the same
// local address to the same remote address and port. The datapath then
// places each join on its own path. Its goroutine runs until stop: when
// its sockets fail it opens new ones, after a backoff.
type pathManager struct {
	pod Pod
	// nsFD is the pod's network namespace, open while the path manager
	// runs: its sessions are opened in it, never again from the pod's
	// path.
	nsFD int
	// joins is how many joins a connection gets; Sync changes it while
	// the path manager runs.
	joins atomic.Int32
	// joinAfter is how many bytes a connection carries before its joins
	// are opened (threshold.go); Sync changes it while the path manager
	// runs.
	joinAfter atomic.Uint64
	up        atomic.Bool
	restarts  atomic.Uint64
	// replacedJoins counts the joins it opened to replace closed
	// subflows (rejoin.go).
	replacedJoins atomic.Uint64
	// releasedJoins counts the held joins it made active (holdoff.go).
	releasedJoins atomic.Uint64
	// leftSubflows counts the subflows it closed on paths that went down
	// (leave.go), whose replacements leaving keeps until they are back.
	leftSubflows atomic.Uint64
	leaving      leaving
	// closed, when set, tells the datapath that the pod's kernel closed
	// the subflow with this 4-tuple (local is the pod's).
	closed func(local, remote netip.AddrPort, token uint32, heard time.Time) (uint32, error)
	// holdoff is how long a new join stays a backup subflow after it is
	// established; 0: joins are opened active.
	holdoff time.Duration
	// opened are the pod's connections it may replace joins of. Its
	// goroutine changes them, under openedMu, which leave takes to read
	// which subflows it could replace.
	openedMu sync.Mutex
	opened   openedConns
	// live are the subflows of all the pod's connections, for their
	// close, and closing those of closed connections waiting for their
	// sockets to go (connclose.go); under openedMu too.
	live    liveConns
	closing []closingSubflow
	// closedGrace is PathManagerOptions.ClosedEntryGrace.
	closedGrace time.Duration
	// listings are the node's listing slots, lister the pod's sock_diag
	// socket for the frequent listings (listing.go).
	listings chan struct{}
	lister   *mptcpnl.Lister
	// joinLister looks held joins up one at a time (holdoff.go): a
	// lookup is one request, not a listing, so it takes no listing slot,
	// and its own socket does not wait for the pod's listings.
	joinLister *mptcpnl.Lister
	// life guards nsFD against its close when the path manager stops:
	// leave, on the agent's goroutine, lists the pod's subflows with it.
	life    sync.RWMutex
	stopped bool
	// current is the session listening now, nil between two. Only tests
	// read it, to break its socket as a failing kernel or a closed
	// descriptor would.
	current atomic.Pointer[session]
	backoff backoff
	log     *slog.Logger
	// malformedLog and lostLog limit the Warn lines of skipped messages
	// and lost events, which a process of the pod can cause at will.
	// Only the path manager's goroutine uses them.
	malformedLog, lostLog logLimiter
	cancel                context.CancelFunc
	done                  chan struct{}
}

// logLimitEvery is how often a path manager logs one kind of skipped
// message at most, after the first.
const logLimitEvery = 10 * time.Second

// logLimiter lets the first line through, then at most one per
// logLimitEvery, which says how many it held back since the last.
type logLimiter struct {
	last       time.Time
	suppressed int
}

// allow says whether to log a line now, and how many were held back before it.
func (l *logLimiter) allow(now time.Time) (ok bool, suppressed int) {
	if !l.last.IsZero() && now.Sub(l.last) < logLimitEvery {
		l.suppressed++
		return false, 0
	}
	l.last, suppressed, l.suppressed = now, l.suppressed, 0
	return true, suppressed
}

// session is one pair of sockets in the pod's namespace: one receives its
// MPTCP events, the other sends the commands that open joins.
type session struct {
	events, cmds *mptcpnl.Conn
	// ended is closed when the session ends; the commands it scheduled
	// (later) are then dropped, and waited for before cmds closes.
	ended     chan struct{}
	scheduled sync.WaitGroup
	// sweeps are its held joins' bookkeeping (holdoff.go).
	sweeps sweeps
	// watchDue says a reading of the connections whose joins wait for
	// their threshold is scheduled (threshold.go); watchFailLog limits
	// the lines of failed ones.
	watchDue     atomic.Bool
	watchFailLog logLimiter
	// closingDue says a check of closed connections' subflows is
	// scheduled (connclose.go).
	closingDue atomic.Bool
}

// later runs fn after delay on its own goroutine, unless the session ends
// first. fn may use cmds (a netlink socket is safe for concurrent use).
func (sess *session) later(delay time.Duration, fn func()) {
	sess.scheduled.Add(1)
	go func() {
		defer sess.scheduled.Done()
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
			fn()
		case <-sess.ended:
		}
	}()
}

// openSession opens a session in the namespace of the file descriptor nsFD.
func openSession(nsFD int) (*session, error) {
	events, err := mptcpnl.Dial(nsFD)
	if err != nil {
		return nil, err
	}
	if err := events.SubscribeEvents(); err != nil {
		events.Close()
		return nil, err
	}
	cmds, err := mptcpnl.Dial(nsFD)
	if err != nil {
		events.Close()
		return nil, err
	}
	return &session{events: events, cmds: cmds, ended: make(chan struct{})}, nil
}

// openNetNS opens the pod's namespace and checks that it is the one of key:
// the path (a /proc/<pid>/ns/net whose PID was reused, a re-created
// sandbox's) may name another namespace by now.
func openNetNS(pod Pod, key podKey) (int, error) {
	fd, err := netnsutil.Open(pod.NetNS)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("network namespace %s: %w", pod.NetNS, err)
	}
	if got := (netnsID{Dev: st.Dev, Ino: st.Ino}); got != key.netns {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("network namespace %s is %d:%d now, not the pod's %d:%d", pod.NetNS, got.Dev, got.Ino, key.netns.Dev, key.netns.Ino)
	}
	return fd, nil
}

// start opens the pod's namespace, checks it is key's, and opens the first
// session before it returns, so that a pod whose namespace refuses is an
// error of this reconcile (and is tried again at the next). It runs the
// path manager from then on, holding the namespace open: every session it
// opens again is in that namespace, whatever its path names by then.
func start(ctx context.Context, w Want, key podKey, b backoff, log *slog.Logger, opts PathManagerOptions, listings chan struct{}) (*pathManager, error) {
	pod := w.Pod
	nsFD, err := openNetNS(pod, key)
	if err != nil {
		return nil, err
	}
	sess, err := openSession(nsFD)
	if err != nil {
		_ = unix.Close(nsFD)
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &pathManager{pod: pod, nsFD: nsFD, backoff: b, log: log.With("pod", pod.Name, "uid", pod.UID), cancel: cancel, done: make(chan struct{}),
		closed: opts.SubflowClosed, holdoff: opts.JoinHoldoff, opened: openedConns{}, listings: listings, lister: mptcpnl.NewLister(nsFD), joinLister: mptcpnl.NewLister(nsFD),
		closedGrace: cmp.Or(opts.ClosedEntryGrace, DefaultClosedEntryGrace)}
	s.joins.Store(int32(w.Joins))
	s.joinAfter.Store(w.JoinAfterBytes)
	s.up.Store(true)
	go s.run(ctx, sess)
	return s, nil
}

// run serves sessions one after the other until ctx ends.
func (s *pathManager) run(ctx context.Context, sess *session) {
	defer close(s.done)
	defer func() {
		s.life.Lock()
		s.stopped = true
		_ = s.lister.Close()
		_ = s.joinLister.Close()
		_ = unix.Close(s.nsFD)
		s.life.Unlock()
	}()
	delay := s.backoff.Min
	for {
		began := time.Now()
		err := s.serve(ctx, sess)
		s.up.Store(false)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) >= s.backoff.Healthy {
			delay = s.backoff.Min
		}
		n := s.restarts.Add(1)
		s.log.Error("path manager stopped: the pod's connections get no joins until it restarts", "err", err, "restarts", n, "retryIn", delay)
		for sess = nil; sess == nil; {
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			delay = min(2*delay, s.backoff.Max)
			if sess, err = openSession(s.nsFD); err != nil {
				s.log.Warn("restarting path manager", "err", err, "retryIn", delay)
			}
		}
		s.up.Store(true)
		s.log.Info("path manager restarted", "restarts", n)
	}
}

// serve reads sess's events until its socket fails (the error) or ctx ends
// (nil), and closes sess. A panic while handling an event ends the session
// as an error would, not the agent.
func (s *pathManager) serve(ctx context.Context, sess *session) (err error) {
	s.current.Store(sess)
	// Joins a path manager before this session held may have missed
	// their release; closes the last session's leave asked for, their
	// event.
	s.sweepLater(sess)
	s.forgetClosing()
	s.openedMu.Lock()
	s.watchAgain(sess)
	// Closes may have gone unheard between the two sessions: the sweep
	// finds those; the subflows of closed connections still queued are
	// checked.
	s.live.clear()
	s.checkClosingLater(sess)
	s.openedMu.Unlock()
	defer func() {
		s.current.Store(nil)
		close(sess.ended)
		sess.scheduled.Wait()
		sess.events.Close()
		sess.cmds.Close()
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			// Closing the socket ends the blocked Receive.
			sess.events.Close()
		case <-sess.ended:
		}
	}()
	for {
		evs, err := sess.events.Receive()
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case errors.Is(err, mptcpnl.ErrMalformed):
			// A process of the pod with CAP_NET_ADMIN can multicast
			// to the socket: skip what does not decode or is not
			// the kernel's, keep the events that do. It decides how
			// often: the log is limited.
			if ok, held := s.malformedLog.allow(time.Now()); ok {
				s.log.Warn("skipping a malformed MPTCP event", "err", err, "suppressed", held)
			}
		case errors.Is(err, unix.ENOBUFS):
			// The kernel dropped events the socket had no room for:
			// their connections get no joins, the socket still works.
			if ok, held := s.lostLog.allow(time.Now()); ok {
				s.log.Warn("MPTCP events lost: the socket's buffer was full", "err", err, "suppressed", held)
			}
			// Closes may be among them: connections remembered
			// now may be gone, and their tokens reused. Forget
			// them all rather than keep what cannot be trusted:
			// they get no replacement joins.
			s.openedMu.Lock()
			// Those whose joins wait get them now: their closes
			// may be lost, and nothing would end the wait.
			s.openWaiting(sess)
			clear(s.opened)
			// The sweep finds their closes now.
			s.live.clear()
			s.openedMu.Unlock()
			s.forgetLeaving()
			// Held joins among them would stay held.
			s.sweepLater(sess)
			continue
		case err != nil:
			return fmt.Errorf("reading MPTCP events: %w", err)
		}
		heard := time.Now()
		for _, ev := range evs {
			s.handle(sess, ev, heard)
		}
	}
}

// openJoins opens the rule's joins of a connection the pod opened; conn is
// the connection as the path manager remembers it, nil when it could not.
// Only the path manager's goroutine calls it.
func (s *pathManager) openJoins(cmds *mptcpnl.Conn, conn *openedConn, token uint32, local netip.Addr, remote netip.AddrPort) {
	// A join is held only where the path manager remembers its
	// connection: it must, to make the join active again.
	held := s.holdoff > 0 && conn != nil
	joins := int(s.joins.Load())
	for i := 0; i < joins; i++ {
		if err := openJoin(cmds, token, local, remote, held); err != nil {
			if errors.Is(err, unix.ENOTCONN) {
				// The connection is closing: the kernel takes a
				// join only while both ends may send, and a
				// short connection's application may shut its
				// side down before the join is asked for.
				s.log.Debug("opening join: the connection no longer takes joins", "remote", remote, "err", err)
				return
			}
			s.log.Warn("opening join", "remote", remote, "err", err)
			return
		}
	}
	s.log.Debug("opened joins", "remote", remote, "joins", joins, "held", held)
}

// openJoin opens one join of the connection token from the pod's address
// local to remote, as a backup subflow when held.
func openJoin(cmds *mptcpnl.Conn, token uint32, local netip.Addr, remote netip.AddrPort, held bool) error {
	var flags uint32
	if held {
		flags = mptcpnl.FlagBackup
	}
	return cmds.CreateSubflow(token, local, joinLocalID, remote, flags)
}

// joinLocalID names the pod's own address for the joins the path manager
// opens; the initial subflow's address keeps id 0.
const joinLocalID = 1

func (s *pathManager) stop() {
	s.cancel()
	<-s.done
}
