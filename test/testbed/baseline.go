package testbed

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// HandRoute installs the hand-routed multipath baseline that the agent is compared with. For server-announced MPTCP
// ports (ports[k-2] is the port of path k, see ConfigureSignalPorts), every node gets, for every path k >= 2:
//
//	ip route add default via 10.(100+k).i.1 dev nic<k> table 100+k
//	ip rule add ipproto tcp dport P_k lookup 100+k
//	ip rule add ipproto tcp sport P_k lookup 100+k
//
// so a subflow to or from port P_k leaves both nodes on NIC k, and everything else stays on NIC 1.
//
// One more rule per node keeps the nodes' own pods reachable from these tables: "to <pod CIDR> lookup main" ahead
// of the port rules. Without it the port rules also catch the traffic toward local pods, which has no route in
// table 100+k but the default one, and strict rp_filter drops the pods' own packets (its reverse lookup swaps the
// ports, so a packet from a pod to port P_k is checked against "sport P_k", i.e. table 100+k, which points at
// nic<k> instead of the pod's veth). See docs/testbed.md.
func (b *Bed) HandRoute(ports []int) error {
	if len(ports) < b.Config.NICs-1 {
		return fmt.Errorf("hand routing %d NICs needs %d ports, got %d", b.Config.NICs, b.Config.NICs-1, len(ports))
	}
	ctx := context.Background()
	for _, n := range b.Nodes {
		cmds := []string{fmt.Sprintf("rule add pref 1000 to %s lookup main", n.PodCIDR)}
		for _, c := range n.NICs[1:] {
			table := strconv.Itoa(100 + c.Index)
			port := ports[c.Index-2]
			cmds = append(cmds,
				fmt.Sprintf("route add default via %s dev %s table %s", c.Gateway, c.Name, table),
				fmt.Sprintf("rule add pref %d ipproto tcp dport %d lookup %s", 1000+2*c.Index, port, table),
				fmt.Sprintf("rule add pref %d ipproto tcp sport %d lookup %s", 1001+2*c.Index, port, table),
			)
		}
		if err := ipBatch(ctx, n.NetNS, cmds...); err != nil {
			return err
		}
	}
	b.mu.Lock()
	b.handRoute = true
	b.mu.Unlock()
	return nil
}

// HandRouted reports whether HandRoute is installed.
func (b *Bed) HandRouted() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.handRoute
}

// ConfigureSignalPorts makes the server pod announce its own address with each of ports (an in-kernel "signal"
// endpoint with a port; the kernel listens on those ports for joins) and accept that many joins.
func (b *Bed) ConfigureSignalPorts(server *Pod, ports []int) error {
	cmds := []string{"mptcp endpoint flush"}
	for _, p := range ports {
		cmds = append(cmds, fmt.Sprintf("mptcp endpoint add %s dev eth0 port %d signal", server.Addr, p))
	}
	cmds = append(cmds, fmt.Sprintf("mptcp limits set subflows %d add_addr_accepted 0", max(len(ports), 2)))
	// The kernel closes a flushed endpoint's listening socket a moment
	// later: re-adding the same port right after can fail with EADDRINUSE
	// (-98), so that error is retried for a few seconds.
	var err error
	for range 20 {
		if err = ipBatch(context.Background(), server.NetNS, cmds...); err == nil || !strings.Contains(err.Error(), "error: -98") {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
	// Still in use: name what holds the ports, in every state.
	out, _ := b.Command(server.NetNS, "ss", "-tanM").CombinedOutput()
	return fmt.Errorf("%w; the server pod's TCP sockets:\n%s", err, out)
}

// ConfigureClientLimits sets a client pod's in-kernel path manager limits: the number of extra subflows it may
// open and how many announced addresses (ADD_ADDR) it accepts and joins. Its MPTCP senders then wait for that
// many joins before their first byte (AwaitJoins).
func (b *Bed) ConfigureClientLimits(pod *Pod, subflows, addAddrAccepted int) error {
	if err := ipBatch(context.Background(), pod.NetNS,
		fmt.Sprintf("mptcp limits set subflows %d add_addr_accepted %d", subflows, addAddrAccepted)); err != nil {
		return err
	}
	b.AwaitJoins(pod, min(subflows, addAddrAccepted))
	return nil
}

// AwaitJoins makes pod's MPTCP senders (Send) write nothing until their connection has n joins (for at most 2 s),
// and then 20 ms more: joins the kernel's path manager opens are otherwise exposed to this kernel placing data at
// the wrong offset (docs/testing.md, "Data integrity"), which no test but the reproducer of that defect is about.
// n = 0 sends at once, as the reproducer must.
func (b *Bed) AwaitJoins(pod *Pod, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.awaitJoins == nil {
		b.awaitJoins = map[*Pod]int{}
	}
	b.awaitJoins[pod] = n
}
