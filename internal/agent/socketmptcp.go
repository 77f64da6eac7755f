package agent

import (
	"errors"
	"fmt"
	"sync"

	"github.com/mptcp-operator/mptcp-operator/internal/socketmptcp"
)

// SocketMPTCP is what the socket program of podMPTCP.transparent kernel
// does on the node, for the node state's TransparentKernel condition.
type SocketMPTCP struct {
	// Wanted counts the plan's pods whose policy says kernel.
	Wanted int
	// Covered counts those whose namespaces the program lists.
	Covered int
	// Unsupported says why the kernel refuses the program, when a pod
	// wants it.
	Unsupported string
}

// socketMPTCPState is the program, loaded while some pod wants it, and
// what the last reconcile made of it.
type socketMPTCPState struct {
	mu   sync.Mutex
	prog *socketmptcp.Program
	// refused is the kernel's answer to the first load: it does not
	// change while the node runs (lockdown, the kernel's version), so it
	// is not asked again.
	refused error
	// cookies are the namespaces' cookies by path, for the pods of the
	// last plan.
	cookies map[string]uint64
	report  SocketMPTCP
}

// syncSocketMPTCP loads the socket program while some pod of plan wants
// it, lists those pods' namespaces in it, and unloads it when none does.
// A kernel that refuses it is reported (SocketMPTCP), not an error of
// the reconcile: everything else of the plan is enforced.
func (a *Agent) syncSocketMPTCP(plan *Plan) error {
	s := &a.socketMPTCP
	s.mu.Lock()
	defer s.mu.Unlock()
	var wanted []PlanPod
	for _, p := range plan.Pods {
		if p.SocketMPTCP {
			wanted = append(wanted, p)
		}
	}
	s.report = SocketMPTCP{Wanted: len(wanted)}
	if len(wanted) == 0 {
		s.cookies = nil
		if s.prog == nil {
			return nil
		}
		err := s.prog.Close()
		s.prog = nil
		a.log.Info("socket program unloaded: no pod wants transparent kernel")
		return err
	}
	if s.prog == nil && s.refused == nil {
		prog, err := socketmptcp.Load()
		if err != nil {
			s.refused = err
			a.log.Warn("socket program refused: pods with transparent kernel keep the sockets they ask for", "err", err)
		} else {
			s.prog = prog
			a.log.Info("socket program attached to update_socket_protocol")
		}
	}
	if s.refused != nil {
		s.report.Unsupported = s.refused.Error()
		return nil
	}
	var errs []error
	cookies, listed := map[string]uint64{}, map[uint64]bool{}
	for _, p := range wanted {
		cookie, ok := s.cookies[p.NetNS]
		if !ok {
			var err error
			if cookie, err = socketmptcp.NetNSCookie(p.NetNS); err != nil {
				errs = append(errs, fmt.Errorf("pod %s: %w", p.Name, err))
				continue
			}
		}
		cookies[p.NetNS], listed[cookie] = cookie, true
	}
	s.cookies = cookies
	if err := s.prog.Set(listed); err != nil {
		errs = append(errs, fmt.Errorf("socket program: %w", err))
	} else {
		s.report.Covered = len(cookies)
	}
	return errors.Join(errs...)
}

// SocketMPTCP reports what the socket program did at the last reconcile.
func (a *Agent) SocketMPTCP() SocketMPTCP {
	a.socketMPTCP.mu.Lock()
	defer a.socketMPTCP.mu.Unlock()
	return a.socketMPTCP.report
}

// closeSocketMPTCP unloads the program as the agent stops: sockets are
// created as asked again until the next agent loads it.
func (a *Agent) closeSocketMPTCP() error {
	s := &a.socketMPTCP
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.prog == nil {
		return nil
	}
	err := s.prog.Close()
	s.prog = nil
	return err
}
