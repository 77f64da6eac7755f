package testbed

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCapturesShowSubflowPlacement checks the capture decoder on the hand-routed baseline, where the placement is
// known: each MPTCP connection's first subflow (to port 5201) crosses NIC 1 of both nodes, its join (to the
// announced port 5202) NIC 2, in both directions.
func TestCapturesShowSubflowPlacement(t *testing.T) {
	RequireTools(t, CaptureTools...)
	b := NewForTest(t, Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit"})
	bin := BuildTraffic(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, server := b.Pod(1, 1), b.Pod(2, 1)
	ports := []int{5202}
	Must(t, b.HandRoute(ports))
	Must(t, b.ConfigureSignalPorts(server, ports))
	Must(t, b.ConfigureClientLimits(client, 2, 1))
	const conns = 3
	srv, err := b.StartTrafficServer(ctx, bin, server, 5201, true)
	Must(t, err)
	w := b.Watch(t)
	started := time.Now()
	sent, sendErr := b.Send(ctx, bin, client, srv.Addr, true, "-conns", "3", "-bytes", "4000000")
	ended := time.Now()
	Must(t, srv.Stop())
	got, err := srv.Reports()
	Must(t, err)
	if _, err := MatchReports(sent, got); err != nil || sendErr != nil {
		w.Fail(errors.Join(err, sendErr))
	}
	files, err := w.Captures()
	Must(t, err)
	a, err := Analyze(files)
	Must(t, err)
	w.Close()

	if len(a.Connections) != conns {
		t.Fatalf("captures show %d MPTCP connections, want %d: %v", len(a.Connections), conns, a.Subflows)
	}
	for _, c := range a.Connections {
		t.Logf("connection %08x", c.Token)
		for _, s := range c.Subflows {
			t.Logf("  %v", s)
		}
		if len(c.Subflows) != 2 || c.Subflows[0].Kind != KindMPCapable || c.Subflows[1].Kind != KindMPJoin {
			t.Errorf("connection %08x: want one MP_CAPABLE and one MP_JOIN subflow, got %v", c.Token, c.Subflows)
			continue
		}
		for _, s := range c.Subflows {
			if s.Opened.Before(started) || s.Opened.After(ended) {
				t.Errorf("subflow %v opened at %v, want within the transfer, %v to %v", s, s.Opened, started, ended)
			}
		}
		if c.Subflows[1].Opened.Before(c.Subflows[0].Opened) {
			t.Errorf("join opened at %v, before its connection's first subflow at %v", c.Subflows[1].Opened, c.Subflows[0].Opened)
		}
		join := c.Subflows[1]
		if join.JoinToken != c.Token || join.Dst.Port() != 5202 {
			t.Errorf("join %v: token %08x, want the connection's %08x, to port 5202", join, join.JoinToken, c.Token)
		}
		for i, want := range []int{1, 2} {
			for _, node := range []int{1, 2} {
				if k, ok := c.Subflows[i].PlacedOn(node); !ok || k != want {
					t.Errorf("subflow %v: on node %d want nic%d in both directions", c.Subflows[i], node, want)
				}
			}
		}
	}
	if err := a.CheckPlacement(1, 2); err != nil {
		t.Error(err)
	}
}

// TestCheckPlacementRejectsSharedNIC feeds CheckPlacement a connection whose two subflows share NIC 1, and one whose
// subflow takes different NICs on the two nodes.
func TestCheckPlacementRejectsSharedNIC(t *testing.T) {
	both := func(k1, k2 int) []Sighting {
		return []Sighting{{1, k1, In, 1}, {1, k1, Out, 1}, {2, k2, In, 1}, {2, k2, Out, 1}}
	}
	for name, tc := range map[string]struct {
		// subflows of one connection, by their sightings
		seen [][]Sighting
		// whether CheckPlacement must accept it
		ok bool
	}{
		"distinct NICs":          {seen: [][]Sighting{both(1, 1), both(2, 2)}, ok: true},
		"shared NIC":             {seen: [][]Sighting{both(1, 1), both(1, 1)}},
		"asymmetric":             {seen: [][]Sighting{both(1, 2)}},
		"one direction only":     {seen: [][]Sighting{{{1, 1, Out, 1}, {2, 1, In, 1}, {2, 1, Out, 1}}}},
		"two NICs one direction": {seen: [][]Sighting{append(both(1, 1), Sighting{1, 2, Out, 1})}},
	} {
		t.Run(name, func(t *testing.T) {
			c := &Connection{Token: 1}
			for _, s := range tc.seen {
				c.Subflows = append(c.Subflows, &Subflow{Kind: KindMPJoin, Conn: 1, Seen: s})
			}
			err := (&Analysis{Connections: []*Connection{c}}).CheckPlacement(1, 2)
			if (err == nil) != tc.ok {
				t.Errorf("CheckPlacement = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestEpochTimeReadsTsharksTimes(t *testing.T) {
	for in, want := range map[string]time.Time{
		"1764060000.123456789": time.Unix(1764060000, 123456789),
		"1764060000.5":         time.Unix(1764060000, 500000000),
		"1764060000":           time.Unix(1764060000, 0),
		"":                     {},
		"x.1":                  {},
		"1.x":                  {},
	} {
		if got := EpochTime(in); !got.Equal(want) {
			t.Errorf("EpochTime(%q) = %v, want %v", in, got, want)
		}
	}
}
