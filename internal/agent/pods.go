package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// maxKernelSubflows is the kernel's cap on subflows_max and add_addr_accepted.
const maxKernelSubflows = 8

// configurePodMPTCP makes subflows possible inside a pod's namespace as its
// rule asks. In userspace mode every pod accepts up to the kernel's limit of
// joins, because the peer's node decides how many it opens. In signal mode a
// server rule's pods announce one port per extra path, and every pod joins
// what its peers announce, up to one subflow per path in total. Pods that both
// announce and accept would open joins from both ends of one connection at
// once (docs/subflows.md): give servers and clients separate rules.
func configurePodMPTCP(pod Pod, rule Rule) error {
	if rule.Subflows == SubflowsNone {
		return nil
	}
	pm := "kernel"
	if rule.Subflows == SubflowsUserspace {
		pm = "userspace"
	}
	if err := netnsutil.WriteSysctl(pod.NetNS, "net.mptcp.enabled", "1"); err != nil {
		return err
	}
	if err := netnsutil.WriteSysctl(pod.NetNS, "net.mptcp.path_manager", pm); err != nil {
		return err
	}
	if err := netnsutil.WriteSysctl(pod.NetNS, "net.mptcp.checksum_enabled", boolSysctl(rule.DataChecksums)); err != nil {
		return err
	}
	return withPodPM(pod, func(c *mptcpnl.Conn) error {
		if err := c.FlushEndpoints(); err != nil {
			return fmt.Errorf("flushing endpoints: %w", err)
		}
		limits := mptcpnl.Limits{Subflows: maxKernelSubflows}
		if rule.Subflows == SubflowsSignal {
			limits.Subflows = uint32(rule.joins())
			limits.AddAddrAccepted = uint32(rule.joins())
			// One signal endpoint per extra path: the kernel listens on
			// the port and announces it to every peer.
			for i := 0; i < rule.joins() && i < len(rule.SignalPorts); i++ {
				for _, ip := range pod.IPs {
					ep := mptcpnl.Endpoint{Addr: ip, ID: uint8(i + 1), Port: rule.SignalPorts[i], Flags: mptcpnl.FlagSignal}
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

// resetPodMPTCP undoes configurePodMPTCP, for uninstall.
func resetPodMPTCP(pod Pod) error {
	if err := netnsutil.WriteSysctl(pod.NetNS, "net.mptcp.path_manager", "kernel"); err != nil {
		return err
	}
	if err := netnsutil.WriteSysctl(pod.NetNS, "net.mptcp.checksum_enabled", "0"); err != nil {
		return err
	}
	return withPodPM(pod, func(c *mptcpnl.Conn) error {
		if err := c.FlushEndpoints(); err != nil {
			return err
		}
		return c.SetLimits(mptcpnl.Limits{Subflows: 2}) // the kernel's default
	})
}

func withPodPM(pod Pod, fn func(*mptcpnl.Conn) error) error {
	c, err := dialPod(pod)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(c)
}

func dialPod(pod Pod) (*mptcpnl.Conn, error) {
	fd, err := netnsutil.Open(pod.NetNS)
	if err != nil {
		return nil, err
	}
	defer closeFD(fd)
	return mptcpnl.Dial(fd)
}

// subflowCreator is the userspace path manager of one pod: when a
// connection the pod opened is established, it opens the rule's joins from
// the same local address to the same remote address and port. The datapath
// then places each join on its own path.
type subflowCreator struct {
	pod Pod
	// joins is how many joins the pod's rule asks for a connection; a
	// reconcile changes it while the creator runs.
	joins  atomic.Int32
	log    *slog.Logger
	events *mptcpnl.Conn
	cmds   *mptcpnl.Conn
	cancel context.CancelFunc
	done   chan struct{}
}

func startSubflowCreator(ctx context.Context, pod Pod, rule Rule, log *slog.Logger) (*subflowCreator, error) {
	events, err := dialPod(pod)
	if err != nil {
		return nil, err
	}
	if err := events.SubscribeEvents(); err != nil {
		events.Close()
		return nil, err
	}
	cmds, err := dialPod(pod)
	if err != nil {
		events.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &subflowCreator{pod: pod, log: log.With("pod", pod.Name), events: events, cmds: cmds, cancel: cancel, done: make(chan struct{})}
	s.setJoins(rule.joins())
	go func() {
		<-ctx.Done()
		// Closing the socket ends the blocked Receive.
		events.Close()
	}()
	go s.run(ctx)
	return s, nil
}

func (s *subflowCreator) run(ctx context.Context) {
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

func (s *subflowCreator) setJoins(n int) { s.joins.Store(int32(n)) }

func (s *subflowCreator) openJoins(token uint32, local netip.Addr, remote netip.AddrPort) {
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

func (s *subflowCreator) stop() {
	s.cancel()
	<-s.done
}
