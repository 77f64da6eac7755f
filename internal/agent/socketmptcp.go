package agent

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/socketmptcp"
)

// SocketMPTCP is what the socket program of podMPTCP.transparent kernel
// does on the node, for the node state's TransparentKernel condition.
type SocketMPTCP struct {
	// Wanted counts the plan's pods whose policy says kernel.
	Wanted int
	// Covered counts those whose namespaces the program lists.
	Covered int
	// Uncovered are the pods (namespace.name) that want the program and
	// are not covered: every one while it is refused or observe-only, else
	// those whose namespace could not be read.
	Uncovered map[string]bool
	// Unsupported says why the kernel refuses the program, when a pod
	// wants it; Retrying, that the refusal may pass and the agent asks
	// again (every socketRetry).
	Unsupported string
	Retrying    bool
	// ObserveOnly: the node changes nothing, sockets included.
	ObserveOnly bool
}

// maxNotCovered bounds the pods SocketMPTCP names.
const maxNotCovered = 4

// Timings of the socket program's life.
const (
	// SocketRetry spaces the loads after a failure that may pass
	// (memory, a busy trampoline); a refusal that will not pass
	// (lockdown, no hook) is not asked again.
	SocketRetry = 30 * time.Second
	// socketIdle is how long the program stays attached, with no
	// namespace listed, after the last pod that wanted it: a policy or an
	// opt-out flapping does not load and unload it each time.
	socketIdle = 5 * time.Minute
)

// socketProgram is what the agent asks of the loaded socket program
// (socketmptcp.Program).
type socketProgram interface {
	Set(cookies map[uint64]bool) error
	Close() error
}

// socketMPTCPState is the program, loaded while some pod wants it, and
// what the last reconcile made of it.
type socketMPTCPState struct {
	mu sync.Mutex
	// load, cookie and now are socketmptcp.Load, podNetNSCookie and
	// time.Now unless a test sets them.
	load   func() (socketProgram, error)
	cookie func(PlanPod) (uint64, error)
	now    func() time.Time
	prog   socketProgram
	// refused is the kernel's last answer to a load, and when it came.
	refused   *socketmptcp.UnsupportedError
	refusedAt time.Time
	// idleSince is when the last pod that wanted the program went.
	idleSince time.Time
	report    SocketMPTCP
}

// syncSocketMPTCP loads the socket program while some pod of plan wants
// it, and lists exactly those pods' namespaces in it. A kernel that
// refuses it, and a pod whose namespace cannot be read, are reported
// (SocketMPTCP), not errors of the reconcile: everything else of the plan
// is enforced, and one pod's problem is its own.
func (a *Agent) syncSocketMPTCP(plan *Plan) error {
	s := &a.socketMPTCP
	s.mu.Lock()
	defer s.mu.Unlock()
	var wanted []PlanPod
	for _, p := range plan.Pods {
		if p.Transparent == TransparencyKernel {
			wanted = append(wanted, p)
		}
	}
	s.defaults()
	now := s.now()
	s.report = SocketMPTCP{Wanted: len(wanted), Uncovered: map[string]bool{}, ObserveOnly: plan.Settings.ObserveOnly && len(wanted) > 0}
	if len(wanted) == 0 || plan.Settings.ObserveOnly {
		for _, p := range wanted {
			s.report.Uncovered[p.Name] = true
		}
		return s.idle(a, now)
	}
	s.idleSince = time.Time{}
	if s.prog == nil && (s.refused == nil || (!s.refused.Permanent && now.Sub(s.refusedAt) >= SocketRetry)) {
		prog, err := s.load()
		var refused *socketmptcp.UnsupportedError
		switch {
		case errors.As(err, &refused):
			s.refused, s.refusedAt = refused, now
			a.log.Warn("socket program refused: pods with transparent kernel keep the sockets they ask for", "err", err, "permanent", refused.Permanent)
		case err != nil:
			return fmt.Errorf("socket program: %w", err)
		default:
			s.prog, s.refused = prog, nil
			a.log.Info("socket program attached to update_socket_protocol")
		}
	}
	if s.prog == nil {
		s.report.Unsupported, s.report.Retrying = s.refused.Error(), !s.refused.Permanent
		for _, p := range wanted {
			s.report.Uncovered[p.Name] = true
		}
		return nil
	}
	listed := map[uint64]bool{}
	for _, p := range wanted {
		cookie, err := s.cookie(p)
		if err != nil {
			a.log.Warn("pod not covered by the socket program", "pod", p.Name, "err", err)
			s.report.Uncovered[p.Name] = true
			continue
		}
		listed[cookie] = true
		s.report.Covered++
	}
	if err := s.prog.Set(listed); err != nil {
		s.report.Covered = 0
		return fmt.Errorf("socket program: %w", err)
	}
	return nil
}

// defaults sets what a test did not.
func (s *socketMPTCPState) defaults() {
	if s.load == nil {
		s.load = func() (socketProgram, error) {
			p, err := socketmptcp.Load()
			if err != nil {
				return nil, err
			}
			return p, nil
		}
	}
	if s.cookie == nil {
		s.cookie = podNetNSCookie
	}
	if s.now == nil {
		s.now = time.Now
	}
}

// podNetNSCookie is the cookie of pod's network namespace, read through a
// descriptor checked against the pod's veth (openPodNetNS).
func podNetNSCookie(pod PlanPod) (uint64, error) {
	fd, err := openPodNetNS(pod)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return socketmptcp.NetNSCookie(fd)
}

// idle lists no namespace, and unloads the program once no pod has wanted
// it for socketIdle.
func (s *socketMPTCPState) idle(a *Agent, now time.Time) error {
	if s.prog == nil {
		return nil
	}
	if s.idleSince.IsZero() {
		s.idleSince = now
	}
	if err := s.prog.Set(nil); err != nil {
		return fmt.Errorf("socket program: %w", err)
	}
	if now.Sub(s.idleSince) < socketIdle {
		return nil
	}
	a.log.Info("socket program unloaded: no pod has wanted transparent kernel for a while", "idle", socketIdle)
	return s.unload()
}

// unload closes the program, if loaded.
func (s *socketMPTCPState) unload() error {
	if s.prog == nil {
		return nil
	}
	err := s.prog.Close()
	s.prog = nil
	return err
}

// SocketMPTCP reports what the socket program did at the last reconcile.
func (a *Agent) SocketMPTCP() SocketMPTCP {
	a.socketMPTCP.mu.Lock()
	defer a.socketMPTCP.mu.Unlock()
	r := a.socketMPTCP.report
	r.Uncovered = maps.Clone(r.Uncovered)
	return r
}

// String is the report as a condition message says it, naming at most
// maxNotCovered of the pods not covered.
func (r SocketMPTCP) String() string {
	msg := fmt.Sprintf("the socket program makes the TCP sockets of %d of %d pods MPTCP", r.Covered, r.Wanted)
	if len(r.Uncovered) > 0 {
		names := slices.Sorted(maps.Keys(r.Uncovered))
		if len(names) > maxNotCovered {
			names = append(names[:maxNotCovered], "and more")
		}
		msg += "; not covered, their network namespace could not be read: " + strings.Join(names, ", ")
	}
	return msg
}

// closeSocketMPTCP unloads the program as the agent stops: sockets are
// created as asked again until the next agent loads it.
func (a *Agent) closeSocketMPTCP() error {
	a.socketMPTCP.mu.Lock()
	defer a.socketMPTCP.mu.Unlock()
	return a.socketMPTCP.unload()
}
