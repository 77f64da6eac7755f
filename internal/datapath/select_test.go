package datapath

import (
	"maps"
	"net/netip"
	"strings"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// placeSYN runs an MP_CAPABLE SYN from src:sport to dst:dport through
// pod_egress and returns the path it was placed on, or -1 if none.
func placeSYN(t *testing.T, dp *Datapath, src netip.Addr, sport uint16, dst netip.Addr, dport uint16) int {
	t.Helper()
	mark := run(t, dp.objs.PodEgress, syn(src, sport, dst, dport, testpkt.MPCapableSYN()), skbContext{})
	if mark&dp.markMask == 0 {
		return -1
	}
	return int(dp.pathOfMark(t, mark))
}

func setRules(t *testing.T, dp *Datapath, rules map[uint32]Rule) {
	t.Helper()
	for id, r := range rules {
		if err := dp.SetRule(id, r); err != nil {
			t.Fatal(err)
		}
	}
}

func stat(t *testing.T, dp *Datapath, s Stat) uint64 {
	t.Helper()
	st, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st[s]
}

var otherNet = netip.MustParseAddr("192.168.7.1")

// Each selector of a rule takes or leaves an opening SYN by its family,
// remote address and service port; a SYN no rule selects is not placed and
// is counted.
func TestSelectors(t *testing.T) {
	tests := map[string]struct {
		rule       Rule
		src, dst   netip.Addr
		dport      uint16
		wantPlaced bool
	}{
		"family IPv4 takes IPv4":   {rule: Rule{Paths: []uint32{3}, Family: FamilyIPv4}, src: clientPod, dst: serverPod, dport: 80, wantPlaced: true},
		"family IPv4 leaves IPv6":  {rule: Rule{Paths: []uint32{3}, Family: FamilyIPv4}, src: clientPod6, dst: serverPod6, dport: 80},
		"family IPv6 takes IPv6":   {rule: Rule{Paths: []uint32{3}, Family: FamilyIPv6}, src: clientPod6, dst: serverPod6, dport: 80, wantPlaced: true},
		"family IPv6 leaves IPv4":  {rule: Rule{Paths: []uint32{3}, Family: FamilyIPv6}, src: clientPod, dst: serverPod, dport: 80},
		"CIDR in":                  {rule: Rule{Paths: []uint32{3}, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}}, src: clientPod, dst: serverPod, dport: 80, wantPlaced: true},
		"CIDR out":                 {rule: Rule{Paths: []uint32{3}, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}}, src: clientPod, dst: otherNet, dport: 80},
		"CIDR host route in":       {rule: Rule{Paths: []uint32{3}, CIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.7.1/32")}}, src: clientPod, dst: otherNet, dport: 80, wantPlaced: true},
		"IPv6 CIDR in":             {rule: Rule{Paths: []uint32{3}, CIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:244:2::/48")}}, src: clientPod6, dst: serverPod6, dport: 80, wantPlaced: true},
		"IPv6 ::/0 leaves IPv4":    {rule: Rule{Paths: []uint32{3}, CIDRs: []netip.Prefix{netip.MustParsePrefix("::/0")}}, src: clientPod, dst: serverPod, dport: 80},
		"IPv4 0.0.0.0/0 takes any": {rule: Rule{Paths: []uint32{3}, CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}, src: clientPod, dst: otherNet, dport: 80, wantPlaced: true},
		"port in":                  {rule: Rule{Paths: []uint32{3}, Ports: []PortRange{{80, 80}, {5000, 5999}}}, src: clientPod, dst: serverPod, dport: 5201, wantPlaced: true},
		"port at range end":        {rule: Rule{Paths: []uint32{3}, Ports: []PortRange{{5000, 5999}}}, src: clientPod, dst: serverPod, dport: 5999, wantPlaced: true},
		"port out":                 {rule: Rule{Paths: []uint32{3}, Ports: []PortRange{{80, 80}, {5000, 5999}}}, src: clientPod, dst: serverPod, dport: 6000},
		"match joins only":         {rule: Rule{Paths: []uint32{3}, Match: MatchJoin}, src: clientPod, dst: serverPod, dport: 80},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dp := loadForTest(t)
			setRules(t, dp, map[uint32]Rule{7: tc.rule})
			if err := dp.SetEndpoint(tc.src, 7); err != nil {
				t.Fatal(err)
			}
			got := placeSYN(t, dp, tc.src, 40000, tc.dst, tc.dport)
			if tc.wantPlaced && got != 3 {
				t.Fatalf("placed on %d, want path 3", got)
			}
			if !tc.wantPlaced {
				if got != -1 {
					t.Fatalf("placed on %d, want not selected", got)
				}
				if n := stat(t, dp, StatNoRuleMatch); n != 1 {
					t.Fatalf("StatNoRuleMatch = %d, want 1", n)
				}
			}
		})
	}
}

// A pod's rules are tried in order: the first that selects a SYN places it,
// and a later rule catches what earlier ones leave.
func TestSelectorPriorityOrder(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{
		3: {Paths: []uint32{6}, Ports: []PortRange{{5201, 5201}}},
		9: {Paths: []uint32{7}, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
		1: {Paths: []uint32{8}},
	})
	if err := dp.SetEndpointRules(clientPod, 3, 9, 1); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dst   netip.Addr
		dport uint16
		want  int
	}{
		{serverPod, 5201, 6}, // all three match: the first wins
		{serverPod, 80, 7},   // the second
		{otherNet, 80, 8},    // only the catch-all
		{otherNet, 5201, 6},
	} {
		if got := placeSYN(t, dp, clientPod, 40000+tc.dport, tc.dst, tc.dport); got != tc.want {
			t.Errorf("%v:%d placed on %d, want %d", tc.dst, tc.dport, got, tc.want)
		}
	}
	// Reordering the chain is a rewrite of the endpoint entry.
	if err := dp.SetEndpointRules(clientPod, 1, 3, 9); err != nil {
		t.Fatal(err)
	}
	if got := placeSYN(t, dp, clientPod, 45000, serverPod, 5201); got != 8 {
		t.Errorf("after reordering placed on %d, want 8", got)
	}
}

// A join of a known connection follows its connection's rule, even when the
// pod's chain would now select it differently.
func TestJoinFollowsItsConnectionsRule(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{
		1: {Paths: []uint32{1, 2, 3}, Ports: []PortRange{{5201, 5201}}},
		2: {Paths: []uint32{10}},
	})
	if err := dp.SetEndpointRules(clientPod, 1, 2); err != nil {
		t.Fatal(err)
	}
	const clientKey, serverKey = 0x1111, 0x2222
	first := placeSYN(t, dp, clientPod, 40000, serverPod, 5201)
	run(t, dp.objs.PodEgress, capableACK(clientPod, 40000, serverPod, 5201, clientKey, serverKey), skbContext{})
	// Now the chain puts everything on path 10 ...
	if err := dp.SetEndpointRules(clientPod, 2); err != nil {
		t.Fatal(err)
	}
	// ... but joins of the connection (even to another port, as a signal
	// endpoint's) stay on its rule's paths, each a distinct one.
	used := map[int]bool{first: true}
	for j := 1; j < 3; j++ {
		frame := syn(clientPod, 40000+uint16(j), serverPod, 6000, testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false))
		p := int(dp.pathOfMark(t, run(t, dp.objs.PodEgress, frame, skbContext{})))
		if p < 1 || p > 3 || used[p] {
			t.Fatalf("join %d on path %d; want one of the connection's rule (1..3) not yet used (%v)", j, p, used)
		}
		used[p] = true
	}
	if got := placeSYN(t, dp, clientPod, 41000, serverPod, 5201); got != 10 {
		t.Fatalf("new connection on %d, want 10 (the new chain)", got)
	}
	conns, err := dp.Connections()
	if err != nil || len(conns) != 1 || conns[0].Rule != 1 {
		t.Fatalf("connections %+v, %v; want one with rule 1", conns, err)
	}
}

// Weighted spread gives each path its weight's share of new connections.
// The placement is deterministic, so over a multiple of the weights' sum the
// shares are exact; the tolerance (1%) only allows for that rounding.
func TestWeightedSpreadShares(t *testing.T) {
	dp := loadForTest(t)
	weights := []uint32{5, 3, 2}
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{5, 2, 9}, Weights: weights, Spread: SpreadWeighted}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	const n = 1000
	got := map[int]int{}
	for i := 0; i < n; i++ {
		got[placeSYN(t, dp, clientPod, uint16(20000+i), serverPod, 80)]++
	}
	for i, path := range []int{5, 2, 9} {
		want := float64(n) * float64(weights[i]) / 10
		if d := float64(got[path]) - want; d > n/100 || d < -n/100 {
			t.Errorf("path %d: %d of %d placements, want %.0f ±1%%", path, got[path], n, want)
		}
	}
	// A path down: its share goes to the others, in their proportion.
	if err := dp.SetPathDown(5, true); err != nil {
		t.Fatal(err)
	}
	got = map[int]int{}
	for i := 0; i < n; i++ {
		got[placeSYN(t, dp, clientPod, uint16(30000+i), serverPod, 80)]++
	}
	if got[5] != 0 || got[2] != 600 || got[9] != 400 {
		t.Errorf("with path 5 down: %v, want 2:600 9:400", got)
	}
}

// Preferred-first places on the first usable path and falls back down the
// list when it is marked down; round robin never uses a down path either.
func TestPreferredFallsBackWhenFirstPathIsDown(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{
		0: {Paths: []uint32{4, 2, 3}, Spread: SpreadPreferred},
		1: {Paths: []uint32{4, 2, 3}},
	})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(serverPod, 1); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if got := placeSYN(t, dp, clientPod, uint16(40000+i), serverPod, 80); got != 4 {
			t.Fatalf("preferred: placed on %d, want 4", got)
		}
	}
	if err := dp.SetPathDown(4, true); err != nil {
		t.Fatal(err)
	}
	if got := placeSYN(t, dp, clientPod, 41000, serverPod, 80); got != 2 {
		t.Fatalf("preferred with 4 down: placed on %d, want 2", got)
	}
	if err := dp.SetPathDown(2, true); err != nil {
		t.Fatal(err)
	}
	if got := placeSYN(t, dp, clientPod, 41001, serverPod, 80); got != 3 {
		t.Fatalf("preferred with 4, 2 down: placed on %d, want 3", got)
	}
	for i := 0; i < 6; i++ {
		if got := placeSYN(t, dp, serverPod, uint16(42000+i), clientPod, 80); got != 3 {
			t.Fatalf("round robin with 4, 2 down: placed on %d, want 3", got)
		}
	}
	if err := dp.SetPathDown(3, true); err != nil {
		t.Fatal(err)
	}
	if got := placeSYN(t, dp, clientPod, 41002, serverPod, 80); got != -1 {
		t.Fatalf("all paths down: placed on %d, want none", got)
	}
	if n := stat(t, dp, StatAllPathsDown); n != 1 {
		t.Fatalf("StatAllPathsDown = %d, want 1", n)
	}
	if err := dp.SetPathDown(4, false); err != nil {
		t.Fatal(err)
	}
	if got := placeSYN(t, dp, clientPod, 41003, serverPod, 80); got != 4 {
		t.Fatalf("preferred with 4 up again: placed on %d, want 4", got)
	}
}

// A rule rewrite applies to the next new subflow; subflows already placed
// keep their path.
func TestRuleRewriteTakesEffectOnNextSubflow(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{2}}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	if got := placeSYN(t, dp, clientPod, 40000, serverPod, 80); got != 2 {
		t.Fatalf("placed on %d, want 2", got)
	}
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{5}, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}})
	data := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 80, Seq: 2, Ack: 8, Flags: testpkt.ACK, Payload: []byte("x")}}.Bytes()
	if got := dp.pathOfMark(t, run(t, dp.objs.PodEgress, data, skbContext{})); got != 2 {
		t.Fatalf("existing subflow moved to %d, want it kept on 2", got)
	}
	if got := placeSYN(t, dp, clientPod, 40001, serverPod, 80); got != 5 {
		t.Fatalf("next subflow on %d, want 5", got)
	}
	// The rewrite replaced the CIDR list: the old one no longer selects.
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{5}, CIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}}})
	if got := placeSYN(t, dp, clientPod, 40002, serverPod, 80); got != -1 {
		t.Fatalf("after the CIDR rewrite placed on %d, want not selected", got)
	}
	if err := dp.DeleteRule(0); err != nil {
		t.Fatal(err)
	}
	if got := placeSYN(t, dp, clientPod, 40003, otherNet, 80); got != -1 {
		t.Fatalf("after DeleteRule placed on %d, want none", got)
	}
}

// Bad rules and endpoints are refused with an error that names the problem,
// and nothing is written.
func TestRuleValidation(t *testing.T) {
	dp := loadForTest(t)
	tests := map[string]struct {
		id   uint32
		rule Rule
		want string
	}{
		"no paths":          {rule: Rule{}, want: "0 paths"},
		"path out of range": {rule: Rule{Paths: []uint32{16}}, want: "out of range 1..15"},
		"path zero":         {rule: Rule{Paths: []uint32{0}}, want: "out of range 1..15"},
		"backup path zero":  {rule: Rule{Paths: []uint32{1}, Backup: []uint32{0}, RewriteHeaders: true}, want: "out of range 1..15"},
		"blocked path zero": {rule: Rule{Paths: []uint32{1}, Blocked: []uint32{0}}, want: "out of range 1..15"},
		"duplicate path":    {rule: Rule{Paths: []uint32{2, 2}}, want: "twice"},
		"weights w/o mode":  {rule: Rule{Paths: []uint32{2}, Weights: []uint32{1}}, want: "ignores"},
		"weights count":     {rule: Rule{Paths: []uint32{2, 3}, Weights: []uint32{1}, Spread: SpreadWeighted}, want: "1 weights for 2 paths"},
		"zero weight":       {rule: Rule{Paths: []uint32{2}, Weights: []uint32{0}, Spread: SpreadWeighted}, want: "out of range 1..255"},
		"bad mode":          {rule: Rule{Paths: []uint32{2}, Spread: 9}, want: "unknown spread mode"},
		"bad family":        {rule: Rule{Paths: []uint32{2}, Family: 3}, want: "unknown address family"},
		"empty port range":  {rule: Rule{Paths: []uint32{2}, Ports: []PortRange{{90, 80}}}, want: "empty"},
		"too many ports":    {rule: Rule{Paths: []uint32{2}, Ports: make([]PortRange, 9)}, want: "at most 8"},
		"CIDR of family":    {rule: Rule{Paths: []uint32{2}, Family: FamilyIPv6, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, want: "family"},
		"rule id":           {id: 256, rule: Rule{Paths: []uint32{2}}, want: "id out of range"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := dp.SetRule(tc.id, tc.rule)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("SetRule error %v, want one containing %q", err, tc.want)
			}
		})
	}
	if err := dp.SetEndpointRules(clientPod); err == nil {
		t.Error("SetEndpointRules with no rules: no error")
	}
	if err := dp.SetEndpointRules(clientPod, 1, 2, 3, 4, 5, 6, 7, 8, 9); err == nil {
		t.Error("SetEndpointRules with 9 rules: no error")
	}
	for _, p := range []uint32{0, 16} {
		if err := dp.SetPathDown(p, true); err == nil {
			t.Errorf("SetPathDown(%d): no error", p)
		}
		if err := dp.SetNIC(7, p); err == nil {
			t.Errorf("SetNIC(7, %d): no error", p)
		}
	}
	eps, err := dp.EndpointRules()
	if err != nil || len(eps) != 0 {
		t.Fatalf("endpoints after refused writes: %v, %v; want none", eps, err)
	}
}

// The server's node selects a subflow arriving at a NIC by the same service
// port as the client's node (the SYN's destination port, here the local
// one) and the remote address (the SYN's source); a subflow no rule selects
// is still mirrored.
func TestResponderSelectsByTheSameServicePort(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{
		4: {Paths: []uint32{1, 2}, Ports: []PortRange{{5201, 5201}}, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}},
	})
	if err := dp.SetEndpointRules(serverPod, 4); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetNIC(7, 2); err != nil {
		t.Fatal(err)
	}
	atNIC := skbContext{IngressIfindex: 7}
	acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 40000), netip.AddrPortFrom(serverPod, 5201), testpkt.MPCapableSYN(), int(atNIC.IngressIfindex), 1, 2)
	acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 40001), netip.AddrPortFrom(serverPod, 80), testpkt.MPCapableSYN(), int(atNIC.IngressIfindex), 3, 4)
	acceptFromWire(t, dp, netip.AddrPortFrom(otherNet, 40002), netip.AddrPortFrom(serverPod, 5201), testpkt.MPCapableSYN(), int(atNIC.IngressIfindex), 5, 6)
	sfs, err := dp.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint16]uint32{40000: 4, 40001: NoRule, 40002: NoRule}
	if len(sfs) != len(want) {
		t.Fatalf("subflows %+v, want %d mirrored", sfs, len(want))
	}
	for _, sf := range sfs {
		if sf.Remote.Port() != 40000 && sf.Remote.Port() != 40001 && sf.Remote.Port() != 40002 {
			t.Fatalf("unexpected subflow %+v", sf)
		}
		if got := sf.Rule; got != want[sf.Remote.Port()] || sf.Path != 2 || sf.Role != RoleResponder {
			t.Errorf("subflow from port %d: rule %d path %d role %d, want rule %d on path 2 as responder", sf.Remote.Port(), got, sf.Path, sf.Role, want[sf.Remote.Port()])
		}
	}
}

// Joins never take a path marked down: they take the connection's other
// free paths, then share the usable ones.
func TestJoinsAvoidDownPaths(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1, 2, 3}, Spread: SpreadPreferred}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	const clientKey, serverKey = 0x31, 0x32
	if got := placeSYN(t, dp, clientPod, 40000, serverPod, 80); got != 1 {
		t.Fatalf("initial subflow on %d, want 1", got)
	}
	run(t, dp.objs.PodEgress, capableACK(clientPod, 40000, serverPod, 80, clientKey, serverKey), skbContext{})
	if err := dp.SetPathDown(2, true); err != nil {
		t.Fatal(err)
	}
	for j := 0; j < 4; j++ {
		frame := syn(clientPod, 40001+uint16(j), serverPod, 80, testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false))
		got := dp.pathOfMark(t, run(t, dp.objs.PodEgress, frame, skbContext{}))
		// The first join takes the only free usable path; later ones
		// share a usable one.
		if j == 0 && got != 3 || got == 2 {
			t.Fatalf("join %d on path %d; path 2 is down, 1 taken", j, got)
		}
	}
	if n := stat(t, dp, StatPathsExhausted); n != 3 {
		t.Fatalf("StatPathsExhausted = %d, want 3", n)
	}
}

// A tenant's preferred paths (the first Preferred of a rule's list) take
// every connection's initial subflow, in every spread mode; the mode
// decides only when none of them is up, and a connection's joins still go
// to its other paths.
func TestPreferredPathsTakeTheInitialSubflowInEveryMode(t *testing.T) {
	for _, mode := range []SpreadMode{SpreadRoundRobin, SpreadWeighted, SpreadPreferred} {
		t.Run(mode.String(), func(t *testing.T) {
			dp := loadForTest(t)
			rule := Rule{Paths: []uint32{3, 1, 2}, Spread: mode, Preferred: 1}
			if mode == SpreadWeighted {
				rule.Weights = []uint32{1, 5, 5}
			}
			setRules(t, dp, map[uint32]Rule{0: rule})
			if err := dp.SetEndpoint(clientPod, 0); err != nil {
				t.Fatal(err)
			}
			for i := range 6 {
				if got := placeSYN(t, dp, clientPod, uint16(40000+i), serverPod, 80); got != 3 {
					t.Fatalf("connection %d started on path %d, want the preferred path 3", i, got)
				}
			}
			const clientKey, serverKey = 0x51, 0x52
			run(t, dp.objs.PodEgress, capableACK(clientPod, 40005, serverPod, 80, clientKey, serverKey), skbContext{})
			join := syn(clientPod, 41000, serverPod, 80, testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false))
			if got := dp.pathOfMark(t, run(t, dp.objs.PodEgress, join, skbContext{})); got == 3 {
				t.Errorf("a join took the path its connection's initial subflow has")
			}
			// The preferred path down: the mode chooses among the others.
			if err := dp.SetPathDown(3, true); err != nil {
				t.Fatal(err)
			}
			seen := map[int]bool{}
			for i := range 6 {
				seen[placeSYN(t, dp, clientPod, uint16(42000+i), serverPod, 80)] = true
			}
			want := map[int]bool{1: true, 2: true}
			if mode == SpreadPreferred {
				want = map[int]bool{1: true}
			}
			if !maps.Equal(seen, want) {
				t.Errorf("with the preferred path down, connections started on %v, want %v", seen, want)
			}
		})
	}
	if err := (Rule{Paths: []uint32{1}, Preferred: 2}).Validate(); err == nil {
		t.Error("two preferred paths of one accepted")
	}
}
