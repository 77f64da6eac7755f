package datapath

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

const (
	tcActShot     = 2 // TC_ACT_SHOT
	tcActRedirect = 7 // TC_ACT_REDIRECT
)

// runOut runs prog on frame and returns its verdict and the frame as the
// program left it.
func runOut(t *testing.T, prog *ebpf.Program, frame []byte) (uint32, []byte) {
	t.Helper()
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: skbContext{}, ContextOut: &skbContext{}}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	// The packet as the program left it: a program may grow it.
	return ret, opts.DataOut
}

// rateBed is a datapath with rule 0 on path 0 selecting client, and rule 0's
// rate caps set to cfg.
func rateBed(t *testing.T, client netip.Addr, cfg RateConfig) *Datapath {
	t.Helper()
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(client, 0); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetRateRule(0, OwnBudget(0), cfg); err != nil {
		t.Fatal(err)
	}
	return dp
}

// dssACK is an ACK the client pod sends, with a DSS DATA_ACK and a window.
func dssACK(client, server netip.Addr, dataACK uint64, window uint16) []byte {
	return testpkt.Frame{Src: client, Dst: server, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 2, Ack: 8, Flags: testpkt.ACK,
		Window: window, Options: testpkt.DSS{DataACK: u64(dataACK)}.Bytes()}}.Bytes()
}

func withWScale(opts []byte, shift int) []byte {
	if shift < 0 {
		return opts
	}
	return testpkt.Join(opts, testpkt.NOP(), testpkt.WScale(uint8(shift)))
}

// handshake runs the subflow's SYN (pod -> peer) and SYN-ACK (peer -> pod)
// through the pod's hooks, each offering window scaling when its shift is
// not negative, and returns both frames.
func handshake(t *testing.T, dp *Datapath, client, server netip.Addr, podShift, peerShift int) [][]byte {
	t.Helper()
	s := syn(client, 40000, server, 5201, withWScale(testpkt.MPCapableSYN(), podShift))
	sa := synAck(server, 5201, client, 40000, withWScale(testpkt.MPCapableSYNACK(0x77), peerShift))
	run(t, dp.Program(HookPodEgress), s, skbContext{})
	run(t, dp.Program(HookPodIngress), sa, skbContext{})
	return [][]byte{s, sa}
}

// The window actor writes the pod's ACKs' window with the scale the
// handshake negotiated (the pod's shift when both ends offered scaling, none
// otherwise), from a paced edge over the DATA_ACK, and never raises a window.
// tshark, given the handshake, agrees on the scale, and finds every
// rewritten packet's IP and TCP checksums good.
func TestRateWindowRespectsScaleAndNeverRaises(t *testing.T) {
	const rateBps, burst = 800_000, 64 << 10 // 100 kB/s: the edge moves 100 bytes a millisecond
	families := []struct {
		name           string
		client, server netip.Addr
	}{{"IPv4", clientPod, serverPod}, {"IPv6", clientPod6, serverPod6}}
	scales := []struct {
		name                string
		podShift, peerShift int  // -1: the option is not offered
		want                uint // the scale in force
	}{
		{"both scale, pod shift 7", 7, 9, 7},
		{"both scale, pod shift 2", 2, 14, 2},
		{"peer does not scale", 7, -1, 0},
		{"pod does not scale", -1, 8, 0},
		{"pod shift 15, taken as 14 (RFC 7323 2.3)", 15, 7, 14},
	}
	for _, fam := range families {
		for _, sc := range scales {
			t.Run(fam.name+"/"+sc.name, func(t *testing.T) {
				dp := rateBed(t, fam.client, RateConfig{Mode: RateWindow, PerConnection: rateBps, HeadersMayBeRewritten: true, BurstBytes: burst})
				frames := handshake(t, dp, fam.client, fam.server, sc.podShift, sc.peerShift)
				egress := dp.Program(HookPodEgress)

				start := time.Now()
				// First ACK: the grant is one burst over the DATA_ACK.
				const da0 = 1_000_000
				in1 := dssACK(fam.client, fam.server, da0, 0xffff)
				ret, out1 := runOut(t, egress, in1)
				// Second ACK: the DATA_ACK moved 60000 bytes at once; the
				// edge moved only rate x elapsed.
				in2 := dssACK(fam.client, fam.server, da0+60000, 0xffff)
				ret2, out2 := runOut(t, egress, in2)
				elapsed := time.Since(start)
				if ret != tcxNext || ret2 != tcxNext {
					t.Fatalf("verdicts %d, %d; want TCX_NEXT", int32(ret), int32(ret2))
				}

				win := func(b []byte) uint { return uint(b[tcpOffset(b)+14])<<8 | uint(b[tcpOffset(b)+15]) }
				want1 := (uint(burst) + 1<<sc.want - 1) >> sc.want
				if want1 > 0xffff {
					// Above what the field holds: the pod's 0xffff is lower.
					if string(out1) != string(in1) {
						t.Errorf("first ACK changed to window %d, want untouched (a cap above the pod's window)", win(out1))
					}
				} else if got := win(out1); got != want1 {
					t.Errorf("first ACK: window field %d, want burst %d >> scale %d = %d", got, burst, sc.want, want1)
				}
				// Rounded up to the scale's unit, so that a small grant
				// is not written as a zero window.
				ceil := func(b uint) uint { return (b + 1<<sc.want - 1) >> sc.want }
				lo := ceil(uint(burst - 60000))
				hi := ceil(uint(burst-60000) + uint(rateBps/8*elapsed.Seconds()) + 1)
				// Third ACK: its own window is below the cap's, so it must
				// pass byte for byte (a window field of 0 cannot be built:
				// testpkt writes 0 as 65535).
				if lo >= 2 {
					in3 := dssACK(fam.client, fam.server, da0+60000, uint16(lo-1))
					if _, out3 := runOut(t, egress, in3); string(out3) != string(in3) {
						t.Errorf("an ACK whose window (%d) is below the cap's (%d) was changed", lo-1, lo)
					}
				}
				if got := win(out2); got < lo || got > hi {
					t.Errorf("second ACK: window field %d, want %d..%d (%d bytes past the DATA_ACK, scale %d, %v elapsed)",
						got, lo, hi, burst-60000, sc.want, elapsed)
				}

				// Fourth ACK: the DATA_ACK passed the edge. The window is
				// one segment, not zero: a zero window would stop the ACKs
				// that open it again.
				in4 := dssACK(fam.client, fam.server, da0+100000, 0xffff)
				_, out4 := runOut(t, egress, in4)
				if got, want := win(out4), ceil(1460); got != want {
					t.Errorf("ACK past the edge: window field %d, want one segment, %d", got, want)
				}

				decoded := tsharkDecode(t, append(frames, out1, out2, out4),
					[]string{"ip.checksum.status", "tcp.checksum.status", "tcp.window_size_value", "tcp.window_size_scalefactor"})
				for i, d := range decoded[2:] {
					if fam.name == "IPv4" && d["ip.checksum.status"] != tsharkGood {
						t.Errorf("rewritten ACK %d: tshark: IP checksum status %q", i+1, d["ip.checksum.status"])
					}
					if d["tcp.checksum.status"] != tsharkGood {
						t.Errorf("rewritten ACK %d: tshark: TCP checksum status %q", i+1, d["tcp.checksum.status"])
					}
					if want := strconv.Itoa(1 << sc.want); sc.want > 0 && d["tcp.window_size_scalefactor"] != want {
						t.Errorf("ACK %d: tshark's scale factor %q, want %s", i+1, d["tcp.window_size_scalefactor"], want)
					}
				}
				if got := decoded[3]["tcp.window_size_value"]; got != fmt.Sprint(win(out2)) {
					t.Errorf("tshark reads window %s, the test read %d", got, win(out2))
				}
				st, err := dp.Stats()
				if err != nil {
					t.Fatal(err)
				}
				if wantN := map[bool]uint64{true: 2, false: 3}[want1 > 0xffff]; st[StatRateWndLowered] != wantN {
					t.Errorf("StatRateWndLowered = %d, want %d", st[StatRateWndLowered], wantN)
				}
			})
		}
	}
}

// tcpOffset is where the TCP header starts in a frame built by testpkt
// (no VLAN, no IP options or extension headers).
func tcpOffset(frame []byte) int {
	if frame[12] == 0x86 && frame[13] == 0xdd {
		return 14 + 40
	}
	return 14 + int(frame[14]&0x0f)*4
}

// Packets the window actor must leave byte for byte: a selected pod's ACK
// without a DSS (TCP fallback), an ACK of a subflow whose handshake the
// actor never saw (scale unknown, counted), a pod that no rule selects, a
// truncated frame, and everything in observe-only mode.
func TestRateWindowLeavesOtherPacketsUnchanged(t *testing.T) {
	cfg := RateConfig{Mode: RateWindow, PerConnection: 800_000, HeadersMayBeRewritten: true, BurstBytes: 64 << 10}
	other := netip.MustParseAddr("10.244.1.99")

	t.Run("no DSS, unselected pod, truncated", func(t *testing.T) {
		dp := rateBed(t, clientPod, cfg)
		handshake(t, dp, clientPod, serverPod, 7, 7)
		plain := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 2, Ack: 8, Flags: testpkt.ACK}}.Bytes()
		full := dssACK(clientPod, serverPod, 5, 0xffff)
		for name, frame := range map[string][]byte{
			"ACK without DSS":         plain,
			"unselected pod's ACK":    dssACK(other, serverPod, 5, 0xffff),
			"truncated in the option": full[:len(full)-3],
		} {
			t.Run(name, func(t *testing.T) {
				run(t, dp.Program(HookPodEgress), frame, skbContext{}) // run fails on any change
			})
		}
	})
	t.Run("handshake not seen", func(t *testing.T) {
		dp := loadForTest(t)
		if err := dp.SetRule(0, Rule{Paths: []uint32{1}}); err != nil {
			t.Fatal(err)
		}
		if err := dp.SetEndpoint(clientPod, 0); err != nil {
			t.Fatal(err)
		}
		// The subflow is placed before the cap exists: the actor never saw
		// its SYN, so it does not know the scale and must not guess.
		run(t, dp.Program(HookPodEgress), syn(clientPod, 40000, serverPod, 5201, withWScale(testpkt.MPCapableSYN(), 7)), skbContext{})
		if err := dp.SetRateRule(0, OwnBudget(0), cfg); err != nil {
			t.Fatal(err)
		}
		run(t, dp.Program(HookPodEgress), dssACK(clientPod, serverPod, 5, 0xffff), skbContext{})
		st, err := dp.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st[StatRateNoWscale] != 1 || st[StatRateWndLowered] != 0 {
			t.Errorf("no-wscale %d, lowered %d; want 1 and 0", st[StatRateNoWscale], st[StatRateWndLowered])
		}
	})
	t.Run("observe-only", func(t *testing.T) {
		dp := rateBed(t, clientPod, cfg)
		handshake(t, dp, clientPod, serverPod, 7, 7)
		if err := dp.SetObserveOnly(true); err != nil {
			t.Fatal(err)
		}
		run(t, dp.Program(HookPodEgress), dssACK(clientPod, serverPod, 5, 0xffff), skbContext{})
	})
}

// police drops what exceeds the bucket (burst, then the rate), in the
// direction it was asked to police and only there, and counts each drop
// under the bucket that refused it. Passed packets are unchanged.
func TestRatePoliceDropsBeyondBucketAndCountsReason(t *testing.T) {
	const rateBps = 8_000_000 // 1 MB/s
	// 64 KiB is 65 ms at the rate: timed with the precise clock; 256 KiB
	// (262 ms) with the coarse one (coarseClockMinDepth).
	const burst, deepBurst = 64 << 10, 256 << 10
	cases := []struct {
		name     string
		cfg      RateConfig
		hook     Hook // where the policed traffic passes
		other    Hook // the other direction, never policed here
		stat     Stat
		policeIn bool
		// derive zeroes the rule's precomputed bucket constants, as in
		// a rule written before they existed: the datapath then
		// derives them on each packet, and must charge the same.
		derive bool
	}{
		{"connection, egress", RateConfig{Mode: RatePolice, PerConnection: rateBps, Directions: Egress, BurstBytes: burst}, HookPodEgress, HookPodIngress, StatRateDropConn, false, false},
		{"pod, ingress", RateConfig{Mode: RatePolice, PerPod: rateBps, Directions: Ingress, BurstBytes: burst}, HookPodIngress, HookPodEgress, StatRateDropPod, true, false},
		{"path, egress", RateConfig{Mode: RatePolice, PerPath: map[uint32]uint64{1: rateBps}, Directions: Egress, BurstBytes: burst}, HookPodEgress, HookPodIngress, StatRateDropPath, false, false},
		{"connection, egress, coarse clock", RateConfig{Mode: RatePolice, PerConnection: rateBps, Directions: Egress, BurstBytes: deepBurst}, HookPodEgress, HookPodIngress, StatRateDropConn, false, false},
		{"connection, egress, costs derived per packet", RateConfig{Mode: RatePolice, PerConnection: rateBps, Directions: Egress, BurstBytes: burst}, HookPodEgress, HookPodIngress, StatRateDropConn, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			burst := int(c.cfg.BurstBytes)
			dp := rateBed(t, clientPod, c.cfg)
			var cfg datapathRateCfg
			if err := dp.objs.RateRules.Lookup(uint32(0), &cfg); err != nil {
				t.Fatal(err)
			}
			if coarse := cfg.Flags&rateCoarseClock != 0; coarse != (burst == deepBurst) {
				t.Fatalf("rule flags %#x: coarse clock %v for a %d-byte bucket at 1 MB/s", cfg.Flags, coarse, burst)
			}
			if c.derive {
				if cfg.ConnGcra.ByteCost == 0 {
					t.Fatal("SetRateRule left the connection bucket's constants zero at 8 Mbit/s")
				}
				cfg.ConnGcra, cfg.PodGcra, cfg.PathGcra = datapathRateGcra{}, datapathRateGcra{}, [16]datapathRateGcra{}
				if err := dp.objs.RateRules.Put(uint32(0), &cfg); err != nil {
					t.Fatal(err)
				}
			}
			run(t, dp.Program(HookPodEgress), syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
			payload := make([]byte, 1400)
			out := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 2, Ack: 8, Flags: testpkt.ACK, Payload: payload}}.Bytes()
			in := testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: 40000, Seq: 8, Ack: 2, Flags: testpkt.ACK, Payload: payload}}.Bytes()
			frames := map[Hook][]byte{HookPodEgress: out, HookPodIngress: in}

			const n = 200
			var passed, dropped int
			start := time.Now()
			for i := 0; i < n; i++ {
				frame := frames[c.hook]
				ret, got := runOut(t, dp.Program(c.hook), frame)
				switch ret {
				case tcxNext:
					passed++
					if string(got) != string(frame) {
						t.Fatalf("packet %d passed changed", i)
					}
				case tcActShot:
					dropped++
				default:
					t.Fatalf("verdict %d", int32(ret))
				}
			}
			elapsed := time.Since(start)
			size := len(frames[c.hook])
			minPass := burst / size
			// The coarse clock may have moved by a tick (4 ms at HZ=250)
			// more than elapsed.
			maxPass := (burst+int(rateBps/8*(elapsed+10*time.Millisecond).Seconds()))/size + 2
			if passed < minPass || passed > maxPass {
				t.Errorf("%d of %d packets of %d bytes passed in %v, want %d..%d (a %d-byte burst and 1 MB/s)",
					passed, n, size, elapsed, minPass, maxPass, burst)
			}
			// The other direction is not policed at all.
			for i := 0; i < n; i++ {
				if ret, _ := runOut(t, dp.Program(c.other), frames[c.other]); ret != tcxNext {
					t.Fatalf("the unpoliced direction (%s) dropped packet %d", c.other, i)
				}
			}
			drops, err := dp.PoliceDrops()
			if err != nil {
				t.Fatal(err)
			}
			st, err := dp.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if st[c.stat] != uint64(dropped) {
				t.Errorf("counter %d = %d, want the %d drops", c.stat, st[c.stat], dropped)
			}
			if drops.Connection+drops.Pod+drops.Path != uint64(dropped) {
				t.Errorf("PoliceDrops %+v, want %d drops in all", drops, dropped)
			}
		})
	}
}

// A bucket's precomputed constants charge a packet its exact cost at the
// rate, rounded up by less than a nanosecond plus a billionth (never down,
// so rounding never lets more through than the cap), at every rate but the
// absurdly slow, which the datapath derives per packet.
func TestRateBucketConstants(t *testing.T) {
	for _, bps := range []uint64{2, 1000, 122_071, 1_000_000, 8_000_000, 40_000_000, 1e9, 10e9, 40e9, 400e9, 1e12, math.MaxUint64} {
		g := gcra(bps, 1<<20)
		if g.ByteCost == 0 {
			t.Errorf("%d bit/s: no constants", bps)
			continue
		}
		if g.ByteCost >= 1<<32 || g.Shift > 32 {
			t.Errorf("%d bit/s: cost %d, shift %d: a 32-bit length times the cost could overflow", bps, g.ByteCost, g.Shift)
		}
		if want := mulDiv(1<<20*8, uint64(time.Second), bps); g.TauNs != want {
			t.Errorf("%d bit/s: tau %d ns, want %d", bps, g.TauNs, want)
		}
		for _, n := range []uint64{1, 60, 1500, 9000, 65535, 1 << 19, 1<<32 - 1} {
			cost := (n*g.ByteCost + 1<<g.Shift - 1) >> g.Shift
			exact := float64(n) * 8e9 / float64(bps)
			if float64(cost) < math.Floor(exact) || float64(cost) > exact*(1+1e-9)+1 {
				t.Errorf("%d bit/s, %d bytes: charged %d ns, exact cost %.3f ns", bps, n, cost, exact)
			}
		}
	}
	if g := gcra(1, 1<<20); g != (datapathRateGcra{}) {
		t.Errorf("1 bit/s: constants %+v, want none (no shift fits)", g)
	}
	if g := gcra(0, 1<<20); g != (datapathRateGcra{}) {
		t.Errorf("no rate: constants %+v", g)
	}
}

// The coarse clock times a rule's buckets only when every one of them is at
// least coarseClockMinDepth deep at its rate.
func TestRatePoliceTakesTheCoarseClockForDeepBucketsOnly(t *testing.T) {
	for _, c := range []struct {
		cfg   RateConfig
		burst uint64
		want  bool
	}{
		{RateConfig{PerConnection: 40_000_000}, 1_000_000, true},                                           // 200 ms
		{RateConfig{PerConnection: 40_000_000}, 400_000, false},                                            // 80 ms
		{RateConfig{PerConnection: 40_000_000, PerPod: 400_000_000}, 1_000_000, false},                     // the pod's 20 ms
		{RateConfig{PerPod: 8_000_000, PerPath: map[uint32]uint64{2: 8_000_000}}, 100_000, true},           // 100 ms each
		{RateConfig{PerPod: 8_000_000, PerPath: map[uint32]uint64{2: 80_000_000, 3: 1}}, 100_000, false},   // path 2: 10 ms
		{RateConfig{PerConnection: 40_000_000}, DefaultBurst(RateConfig{PerConnection: 40_000_000}), true}, // the default
	} {
		if got := coarseClockFits(c.cfg, c.burst); got != c.want {
			t.Errorf("coarseClockFits(%+v, %d) = %v, want %v", c.cfg, c.burst, got, c.want)
		}
	}
}

// A per-connection police cap charges every subflow of a learnt connection
// to one bucket: once the initial subflow's data has emptied it, a join's
// data is dropped too (a bucket per subflow would let it through), and the
// bucket is the connection's, keyed by its canonical token.
func TestRatePoliceChargesAConnectionsSubflowsToOneBucket(t *testing.T) {
	// 80 kbit/s: the join's packet right after the drop finds the bucket
	// still empty unless a busy machine pauses 145 ms between the two.
	const burst = 64 << 10
	dp := rateBed(t, clientPod, RateConfig{Mode: RatePolice, PerConnection: 80_000, Directions: Egress, BurstBytes: burst})
	egress := dp.Program(HookPodEgress)
	const clientKey, serverKey = 0x0a0b0c0d0e0f1011, 0x0102030405060708
	run(t, egress, syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
	run(t, egress, capableACK(clientPod, 40000, serverPod, 5201, clientKey, serverKey), skbContext{})
	run(t, egress, syn(clientPod, 40001, serverPod, 5201, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false)), skbContext{})
	data := func(sport uint16) []byte {
		return testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: sport, DstPort: 5201, Seq: 2, Ack: 8, Flags: testpkt.ACK,
			Payload: make([]byte, 1400)}}.Bytes()
	}
	passed := 0
	for i := 0; i < 200; i++ {
		ret, _ := runOut(t, egress, data(40000))
		if ret == tcActShot {
			break
		}
		passed++
	}
	if passed == 0 || passed == 200 {
		t.Fatalf("%d of 200 packets of the initial subflow passed: the bucket never emptied or never let anything in", passed)
	}
	if ret, _ := runOut(t, egress, data(40001)); ret != tcActShot {
		t.Errorf("the join's data passed (verdict %d) after the connection's bucket emptied: charged to a bucket of its own", int32(ret))
	}
	keys, err := dp.policeKeys()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(keys, func(k datapathRateKey) bool { return k.Kind == rateKindConn && k.Id == tokenOf(serverKey) }) {
		t.Error("no bucket keyed by the connection's canonical token")
	}
}

// SetRateRule refuses what the datapath cannot enforce, with the reason.
func TestSetRateRuleValidates(t *testing.T) {
	bad := map[string]RateConfig{
		"unknown mode":                 {Mode: 9, PerConnection: 1},
		"no cap":                       {Mode: RatePolice, Directions: Egress},
		"zero path rate":               {Mode: RatePolice, PerPath: map[uint32]uint64{2: 0}, Directions: Egress},
		"path out of range":            {Mode: RatePolice, PerPath: map[uint32]uint64{uint32(MaxPaths) + 1: 1}, Directions: Egress},
		"police without direction":     {Mode: RatePolice, PerPod: 1},
		"window without opt-in":        {Mode: RateWindow, PerConnection: 1},
		"window per pod":               {Mode: RateWindow, PerPod: 1, HeadersMayBeRewritten: true},
		"shape per connection":         {Mode: RateShape, PerConnection: 1},
		"burst below the floor":        {Mode: RatePolice, PerPod: 1, Directions: Egress, BurstBytes: 1000},
		"burst beyond a gibibyte":      {Mode: RatePolice, PerPod: 1, Directions: Egress, BurstBytes: 2 << 30},
		"directions with unknown bits": {Mode: RatePolice, PerPod: 1, Directions: 1 << 5},
	}
	dp := loadForTest(t)
	for name, c := range bad {
		if err := dp.SetRateRule(1, OwnBudget(1), c); err == nil {
			t.Errorf("%s: SetRateRule accepted %+v", name, c)
		}
	}
	if err := dp.SetRateRule(1, RateBudget{Pod: 1, Path: uint32(MaxRules)}, RateConfig{Mode: RateShape, PerPod: 5_000_000}); err == nil {
		t.Error("SetRateRule accepted a budget that is no rule id")
	}
	if ids, err := dp.RateRules(); err != nil || len(ids) != 0 {
		t.Fatalf("after refusals: rate rules %v (%v), want none", ids, err)
	}
	if err := dp.SetRateRule(1, OwnBudget(1), RateConfig{Mode: RateShape, PerPod: 5_000_000}); err != nil {
		t.Fatal(err)
	}
	if err := dp.ClearRateRule(1); err != nil {
		t.Fatal(err)
	}
	if ids, err := dp.RateRules(); err != nil || len(ids) != 0 {
		t.Fatalf("after ClearRateRule: rate rules %v (%v), want none", ids, err)
	}
}

// In observe-only mode police drops nothing: it counts StatObserved where
// it would have dropped, and no drop counter moves.
func TestRatePoliceObserveOnlyDropsNothing(t *testing.T) {
	// 80 kbit/s: a packet's worth of tokens takes 145 ms to come back,
	// however slowly a busy machine runs the packets.
	dp := rateBed(t, clientPod, RateConfig{Mode: RatePolice, PerConnection: 80_000, Directions: Egress, BurstBytes: 64 << 10})
	if err := dp.SetObserveOnly(true); err != nil {
		t.Fatal(err)
	}
	run(t, dp.Program(HookPodEgress), syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
	frame := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 2, Ack: 8, Flags: testpkt.ACK, Payload: make([]byte, 1400)}}.Bytes()
	for i := 0; i < 200; i++ {
		run(t, dp.Program(HookPodEgress), frame, skbContext{}) // fails on a drop or a change
	}
	st, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// 201 packets that would have been marked, and of the 200 of 1454
	// bytes against a 64 KiB burst at 10 kB/s at least 150 that would have
	// been dropped (the burst passes 46, and 4 more come back in 0.6 s).
	if st[StatRateDropConn] != 0 || st[StatObserved] < 201+150 {
		t.Errorf("observe-only: drops %d, observed %d; want 0 and at least %d", st[StatRateDropConn], st[StatObserved], 201+150)
	}
}

// Rules that share a budget share the pod and path buckets: two variants of
// one policy (two pods with different preferred paths, each under its own
// rule) fill one path bucket, so a preference brings no budget of its own;
// and a variant with caps of its own shares the policy's path bucket.
// Rules with a budget each are policed apart.
func TestRatePoliceRulesSharingABudgetShareItsBuckets(t *testing.T) {
	// 80 kbit/s: a packet's worth of tokens takes 145 ms to come back,
	// however slowly a busy machine runs the packets.
	const rateBps, burst = 80_000, 64 << 10
	other := netip.MustParseAddr("10.244.1.12")
	for _, tc := range []struct {
		name      string
		budgetOf1 RateBudget
		wantDrop1 bool
	}{
		{name: "shared", budgetOf1: OwnBudget(0), wantDrop1: true},
		{name: "path shared", budgetOf1: RateBudget{Pod: 1, Path: 0}, wantDrop1: true},
		{name: "apart", budgetOf1: OwnBudget(1), wantDrop1: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp := loadForTest(t)
			cfg := RateConfig{Mode: RatePolice, PerPath: map[uint32]uint64{1: rateBps}, Directions: Egress, BurstBytes: burst}
			for id, budget := range map[uint32]RateBudget{0: OwnBudget(0), 1: tc.budgetOf1} {
				if err := dp.SetRule(id, Rule{Paths: []uint32{1}}); err != nil {
					t.Fatal(err)
				}
				if err := dp.SetRateRule(id, budget, cfg); err != nil {
					t.Fatal(err)
				}
			}
			if err := dp.SetEndpoint(clientPod, 0); err != nil {
				t.Fatal(err)
			}
			if err := dp.SetEndpoint(other, 1); err != nil {
				t.Fatal(err)
			}
			data := func(from netip.Addr) []byte {
				return testpkt.Frame{Src: from, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 2, Ack: 8,
					Flags: testpkt.ACK, Payload: make([]byte, 1400)}}.Bytes()
			}
			egress := dp.Program(HookPodEgress)
			for _, pod := range []netip.Addr{clientPod, other} {
				run(t, egress, syn(pod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
			}
			// Rule 0's connection empties the path's bucket.
			dropped0 := false
			for i := 0; i < 2*burst/1400 && !dropped0; i++ {
				ret, _ := runOut(t, egress, data(clientPod))
				dropped0 = ret == tcActShot
			}
			if !dropped0 {
				t.Fatal("rule 0's connection was never policed")
			}
			ret, _ := runOut(t, egress, data(other))
			if dropped1 := ret == tcActShot; dropped1 != tc.wantDrop1 {
				t.Errorf("rule 1's first packet dropped: %v, want %v (budget %+v)", dropped1, tc.wantDrop1, tc.budgetOf1)
			}
		})
	}
}

// runIn runs prog on frame with the context in and returns its verdict and
// the context it left.
func runIn(t *testing.T, prog *ebpf.Program, frame []byte, in skbContext) (uint32, skbContext) {
	t.Helper()
	out := skbContext{}
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: in, ContextOut: &out})
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret, out
}

// A pod's per-pod cap holds for everything it sends and receives on its
// rule's paths, whatever the protocol: UDP, and TCP of no subflow the
// datapath knows (plain TCP, a fallen-back or evicted subflow), are policed
// where they leave a path's NIC (nic_egress, by the NIC's path) or enter the
// pod (pod_ingress, by the path of the NIC they arrived on), under the
// pod's first rule that has the path and caps the pod. What leaves is
// charged to the pod whose interface it entered the node by, whatever its
// source address: a pod that writes another's address is charged itself,
// and a packet from no selected pod's interface to nobody. Nothing is
// charged off the rule's paths, or for a bare TCP ACK.
func TestRatePoliceCapsAPodsTrafficWhateverItsProtocol(t *testing.T) {
	// 80 kbit/s: a packet's worth of tokens takes 145 ms to come back, so
	// the 200 packets pass the burst and hardly more on a busy machine.
	const rateBps, burst = 80_000, 64 << 10
	const lo = 1         // the test run's device: loopback, ifindex 1
	const podIf = 4242   // the client pod's host-side interface
	const otherIf = 4343 // another pod's, not selected
	udp := func(src, dst netip.Addr) []byte {
		return testpkt.Frame{Src: src, Dst: dst, Protocol: 17, Payload: make([]byte, 1400)}.Bytes()
	}
	// The destination option claims 8 x 255 bytes more than the packet
	// has: the parser calls it malformed, routers forward it.
	badDestOpts := func() []byte {
		b := testpkt.Frame{Src: clientPod6, Dst: serverPod6, Protocol: 17, IPv6DestOpts: 1, Payload: make([]byte, 1400)}.Bytes()
		b[14+40+1] = 0xff
		return b
	}
	fragment := func(b []byte) []byte {
		b[14+6] = 0x20 // IPv4: more fragments
		return b
	}
	tcp := func(src, dst netip.Addr, payload int) []byte {
		return testpkt.Frame{Src: src, Dst: dst, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 80, Seq: 2, Ack: 8, Flags: testpkt.ACK,
			Payload: make([]byte, payload)}}.Bytes()
	}
	cases := []struct {
		name    string
		hook    Hook
		dirs    Direction
		nicPath uint32 // the path of the NIC the packets leave or came in by
		frame   []byte
		policed bool
		from    uint32 // nic_egress: the interface the packets entered the node by; 0: the pod's
	}{
		{"UDP sent", HookNICEgress, Egress, 1, udp(clientPod, serverPod), true, 0},
		{"UDP fragments sent", HookNICEgress, Egress, 1, fragment(udp(clientPod, serverPod)), true, 0},
		{"plain TCP sent", HookNICEgress, Egress, 1, tcp(clientPod, serverPod, 1400), true, 0},
		{"UDP received", HookPodIngress, Ingress, 1, udp(serverPod, clientPod), true, 0},
		{"plain TCP received", HookPodIngress, Ingress, 1, tcp(serverPod, clientPod, 1400), true, 0},
		{"bare TCP ACKs sent", HookNICEgress, Egress, 1, tcp(clientPod, serverPod, 0), false, 0},
		{"UDP sent off the rule's paths", HookNICEgress, Egress, 2, udp(clientPod, serverPod), false, 0},
		{"UDP sent, only ingress capped", HookNICEgress, Ingress, 1, udp(clientPod, serverPod), false, 0},
		{"UDP the pod sends with another address", HookNICEgress, Egress, 1, udp(netip.MustParseAddr("10.244.1.99"), serverPod), true, 0},
		{"UDP with the pod's address from another pod", HookNICEgress, Egress, 1, udp(clientPod, serverPod), false, otherIf},
		{"IPv6 with a destination option that does not fit", HookNICEgress, Egress, 1, badDestOpts(), true, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dp := rateBed(t, clientPod, RateConfig{Mode: RatePolice, PerPod: rateBps, Directions: c.dirs, BurstBytes: burst})
			if err := dp.SetEndpoint(clientPod6, 0); err != nil {
				t.Fatal(err)
			}
			if err := dp.SetNIC(lo, c.nicPath); err != nil {
				t.Fatal(err)
			}
			if err := dp.SyncPodInterfaces([]PodInterface{{Ifindex: podIf, Addr: clientPod}, {Ifindex: podIf, Addr: clientPod6}}); err != nil {
				t.Fatal(err)
			}
			in := skbContext{IngressIfindex: podIf}
			if c.from != 0 {
				in.IngressIfindex = c.from
			}
			if c.hook == HookPodIngress {
				in.IngressIfindex = lo
			}
			const n = 200
			passed := 0
			for i := 0; i < n; i++ {
				switch ret, _ := runIn(t, dp.Program(c.hook), c.frame, in); ret {
				case tcxNext:
					passed++
				case tcActShot:
				default:
					t.Fatalf("verdict %d", int32(ret))
				}
			}
			st, err := dp.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if !c.policed {
				if passed != n || st[StatRateDropPod] != 0 {
					t.Errorf("%d of %d passed, %d pod drops: want every packet through", passed, n, st[StatRateDropPod])
				}
				return
			}
			if maxPass := burst/len(c.frame) + 10; passed < burst/len(c.frame) || passed > maxPass {
				t.Errorf("%d of %d packets of %d bytes passed, want the %d-byte burst's (at most %d)", passed, n, len(c.frame), burst, maxPass)
			}
			if st[StatRateDropPod] != uint64(n-passed) {
				t.Errorf("%d pod drops counted, want %d", st[StatRateDropPod], n-passed)
			}
		})
	}
}

// A pod's packets that no subflow entry names leave a path's NIC for the
// pod's class of its shaping rule: through the NIC's class that redirects
// to the shaping device, where the pod's class is.
func TestRateShapeClassifiesAPodsTrafficWhateverItsProtocol(t *testing.T) {
	const lo, class, viaIFB = 1, 0x6d701005, 0x6d700002
	dp := rateBed(t, clientPod, RateConfig{Mode: RateShape, PerPod: 5_000_000})
	if err := dp.SetNIC(lo, 1); err != nil {
		t.Fatal(err)
	}
	if err := dp.SyncShapeClasses([]ShapeClass{{Rule: 0, Path: 1, Pod: clientPod, ClassID: class}}); err != nil {
		t.Fatal(err)
	}
	const podIf = 4242
	if err := dp.SyncPodInterfaces([]PodInterface{{Ifindex: podIf, Addr: clientPod}}); err != nil {
		t.Fatal(err)
	}
	for name, frame := range map[string][]byte{
		"UDP":       testpkt.Frame{Src: clientPod, Dst: serverPod, Protocol: 17, Payload: make([]byte, 100)}.Bytes(),
		"plain TCP": testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 80, Seq: 2, Ack: 8, Flags: testpkt.ACK, Payload: make([]byte, 100)}}.Bytes(),
	} {
		if ret, out := runIn(t, dp.Program(HookNICEgress), frame, skbContext{IngressIfindex: podIf}); ret != tcxNext || out.Priority != viaIFB {
			t.Errorf("%s: verdict %d, priority %#x, want %#x", name, int32(ret), out.Priority, viaIFB)
		}
	}
}

// A SYN that carries data on a subflow the datapath knows (TCP Fast Open,
// or a raw socket's stream of them) is charged like any segment; a SYN
// without data never is.
func TestRatePoliceChargesSYNsThatCarryData(t *testing.T) {
	const burst = 64 << 10
	dp := rateBed(t, clientPod, RateConfig{Mode: RatePolice, PerConnection: 80_000, Directions: Egress, BurstBytes: burst})
	egress := dp.Program(HookPodEgress)
	run(t, egress, syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
	withData := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 1,
		Flags: testpkt.SYN, Payload: make([]byte, 1400)}}.Bytes()
	dropped := 0
	for i := 0; i < 2*burst/1400; i++ {
		if ret, _ := runOut(t, egress, withData); ret == tcActShot {
			dropped++
		}
	}
	if dropped == 0 {
		t.Errorf("%d SYNs of 1400 bytes of data passed a %d-byte bucket: none charged", 2*burst/1400, burst)
	}
	for i := 0; i < 100; i++ {
		run(t, egress, syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
	}
}

// A pod's MPTCP subflows and the rest of what it sends share its one pod
// bucket: UDP that empties the bucket at nic_egress leaves the pod's
// subflow no room at pod_egress, and the drop is the pod bucket's.
func TestRatePolicePodBucketIsSharedBySubflowsAndEveryOtherProtocol(t *testing.T) {
	const burst, lo, podIf = 64 << 10, 1, 4242
	// 80 kbit/s: a packet's worth of tokens takes 145 ms to come back,
	// however slowly a busy machine runs the packets one after the other.
	dp := rateBed(t, clientPod, RateConfig{Mode: RatePolice, PerPod: 80_000, Directions: Egress, BurstBytes: burst})
	if err := dp.SetNIC(lo, 1); err != nil {
		t.Fatal(err)
	}
	if err := dp.SyncPodInterfaces([]PodInterface{{Ifindex: podIf, Addr: clientPod}}); err != nil {
		t.Fatal(err)
	}
	egress := dp.Program(HookPodEgress)
	run(t, egress, syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
	udp := testpkt.Frame{Src: clientPod, Dst: serverPod, Protocol: 17, Payload: make([]byte, 1400)}.Bytes()
	emptied := false
	for i := 0; i < 2*burst/1400 && !emptied; i++ {
		ret, _ := runIn(t, dp.Program(HookNICEgress), udp, skbContext{IngressIfindex: podIf})
		emptied = ret == tcActShot
	}
	if !emptied {
		t.Fatal("the pod's UDP never emptied its bucket")
	}
	data := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 2, Ack: 8,
		Flags: testpkt.ACK, Payload: make([]byte, 1400)}}.Bytes()
	before, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if ret, _ := runOut(t, egress, data); ret != tcActShot {
		t.Fatalf("the subflow's data passed a pod bucket the pod's UDP had emptied (verdict %d)", int32(ret))
	}
	after, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if after[StatRateDropPod] != before[StatRateDropPod]+1 {
		t.Errorf("pod drops %d -> %d, want the subflow's packet counted as the pod bucket's", before[StatRateDropPod], after[StatRateDropPod])
	}
}

// A selected pod that writes a neighbour's source address is not the
// neighbour: its MP_CAPABLE SYN opens no subflow under the neighbour's rules
// and counts nothing as the neighbour's. A pod writing its own address, and
// an interface the agent named no pod of, place as before.
func TestAPodThatWritesAnotherPodsAddressPlacesNothingAsIt(t *testing.T) {
	const lo = 1 // the test run's device: the packets enter the node there
	neighbour := netip.MustParseAddr("10.244.1.12")
	for _, c := range []struct {
		name   string
		owner  netip.Addr // the pod of loopback; invalid: none
		from   netip.Addr
		placed bool
	}{
		{"its own address", clientPod, clientPod, true},
		{"a neighbour's address", clientPod, neighbour, false},
		{"an interface of no pod the agent named", netip.Addr{}, neighbour, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dp := loadForTest(t)
			if err := dp.SetRule(0, Rule{Paths: []uint32{1}}); err != nil {
				t.Fatal(err)
			}
			for _, a := range []netip.Addr{clientPod, neighbour} {
				if err := dp.SetEndpoint(a, 0); err != nil {
					t.Fatal(err)
				}
			}
			var ifs []PodInterface
			if c.owner.IsValid() {
				ifs = append(ifs, PodInterface{Ifindex: lo, Addr: c.owner})
			}
			if err := dp.SyncPodInterfaces(ifs); err != nil {
				t.Fatal(err)
			}
			run(t, dp.Program(HookPodEgress), syn(c.from, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
			sfs, err := dp.Subflows()
			if err != nil {
				t.Fatal(err)
			}
			if placed := len(sfs) == 1; placed != c.placed {
				t.Errorf("subflows %+v: placed %v, want %v", sfs, placed, c.placed)
			}
		})
	}
}

// A pod that writes the 4-tuple of a neighbour's live subflow is not the
// neighbour: its packets are dropped, counted, and count nothing as the
// neighbour's nor teach the neighbour's connection anything (its third
// ACK's keys); in observe-only mode they pass, unmarked. The neighbour's own
// packets, from its own interface, take the path, count and teach.
func TestAPodThatWritesANeighboursSubflowIsDropped(t *testing.T) {
	const lo = 1 // the test run's device: the packets enter the node there
	neighbour := netip.MustParseAddr("10.244.1.12")
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1}}); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{clientPod, neighbour} {
		if err := dp.SetEndpoint(a, 0); err != nil {
			t.Fatal(err)
		}
	}
	podOfLo := func(a netip.Addr) {
		t.Helper()
		if err := dp.SyncPodInterfaces([]PodInterface{{Ifindex: lo, Addr: a}}); err != nil {
			t.Fatal(err)
		}
	}
	egress := dp.Program(HookPodEgress)
	podOfLo(neighbour)
	run(t, egress, syn(neighbour, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
	run(t, dp.Program(HookPodIngress), synAck(serverPod, 5201, neighbour, 40000, testpkt.MPCapableSYNACK(0x77)), skbContext{})
	thirdACK := testpkt.Frame{Src: neighbour, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 2, Ack: 8,
		Flags: testpkt.ACK, Options: testpkt.MPCapableACK(0x66, 0x77)}}.Bytes()
	sent := func() uint64 {
		t.Helper()
		sfs, err := dp.Subflows()
		if err != nil || len(sfs) != 1 {
			t.Fatalf("subflows %+v (%v), want the neighbour's one", sfs, err)
		}
		return sfs[0].Counters.TxPackets
	}
	learnt := func() int {
		t.Helper()
		conns, err := dp.Connections()
		if err != nil {
			t.Fatal(err)
		}
		return len(conns)
	}

	podOfLo(clientPod)
	before, dropped := sent(), stat(t, dp, StatForeign4TupleDropped)
	if v := verdict(t, egress, thirdACK, skbContext{}); v != tcActShot {
		t.Errorf("the other pod's packet on the neighbour's 4-tuple: verdict %d, want dropped", int32(v))
	}
	if err := dp.SetObserveOnly(true); err != nil {
		t.Fatal(err)
	}
	if mark := run(t, egress, thirdACK, skbContext{}); mark&dp.markMask != 0 {
		t.Errorf("in observe-only mode the other pod's packet left with path mark %#x, want none", mark)
	}
	if err := dp.SetObserveOnly(false); err != nil {
		t.Fatal(err)
	}
	if n := stat(t, dp, StatForeign4TupleDropped) - dropped; n != 2 {
		t.Errorf("foreign_4tuple_dropped counted %d, want 2", n)
	}
	if after := sent(); after != before {
		t.Errorf("the neighbour's subflow counts %d packets sent after the other pod's, want %d", after, before)
	}
	if n := learnt(); n != 0 {
		t.Errorf("the other pod's third ACK taught %d connections, want none", n)
	}

	podOfLo(neighbour)
	if mark := run(t, egress, thirdACK, skbContext{}); mark&dp.markMask == 0 {
		t.Error("the neighbour's own third ACK left with no path mark")
	}
	if after := sent(); after != before+1 {
		t.Errorf("the neighbour's subflow counts %d packets sent after its own, want %d", after, before+1)
	}
	if n := learnt(); n != 1 {
		t.Errorf("the neighbour's own third ACK taught %d connections, want 1", n)
	}
}

// The window scale the window cap writes with is learnt once per subflow,
// from its handshake: a SYN or SYN-ACK the pod sends later on the live
// 4-tuple (forged for its own subflow, or for a neighbour's) changes nothing,
// and of two window-scale options in the pod's SYN the last counts, as the
// kernel reads it.
func TestRateWindowScaleIsLearntOnceFromTheHandshake(t *testing.T) {
	const rateBps, burst = 800_000, 64 << 10
	for _, c := range []struct {
		name    string
		synOpts []byte
		want    uint
	}{
		{"one option, shift 7", withWScale(testpkt.MPCapableSYN(), 7), 7},
		{"shift 0, then shift 7: the last counts", testpkt.Join(testpkt.MPCapableSYN(), testpkt.NOP(), testpkt.WScale(0),
			testpkt.NOP(), testpkt.WScale(7)), 7},
	} {
		t.Run(c.name, func(t *testing.T) {
			dp := rateBed(t, clientPod, RateConfig{Mode: RateWindow, PerConnection: rateBps, HeadersMayBeRewritten: true, BurstBytes: burst})
			egress := dp.Program(HookPodEgress)
			run(t, egress, syn(clientPod, 40000, serverPod, 5201, c.synOpts), skbContext{})
			run(t, dp.Program(HookPodIngress), synAck(serverPod, 5201, clientPod, 40000, withWScale(testpkt.MPCapableSYNACK(0x77), 9)), skbContext{})
			// Forged on the live 4-tuple: a SYN with shift 14, a SYN-ACK
			// with shift 0.
			verdict(t, egress, syn(clientPod, 40000, serverPod, 5201, withWScale(testpkt.MPCapableSYN(), 14)), skbContext{})
			verdict(t, egress, synAck(clientPod, 40000, serverPod, 5201, withWScale(testpkt.MPCapableSYNACK(0x77), 0)), skbContext{})

			_, out := runOut(t, egress, dssACK(clientPod, serverPod, 1_000_000, 0xffff))
			got := uint(out[tcpOffset(out)+14])<<8 | uint(out[tcpOffset(out)+15])
			if want := (uint(burst) + 1<<c.want - 1) >> c.want; got != want {
				t.Errorf("window field %d, want burst %d >> the handshake's scale %d = %d", got, burst, c.want, want)
			}
		})
	}
}

// A pod's shape class is on the node's shaping device, one queue for all
// its paths: on the NIC a subflow's packet from the pod's own interface
// goes to the class that redirects there (the pod's class in tc_index,
// which a test run does not report); the same 4-tuple from any other
// interface takes no class of the pod's.
// The device gives the packet back to the NIC, where nic_egress gives it its
// rule's path class and never sends it round again; without one, the NIC's
// class for what the device gives back (under the path's capacity), never
// the pod's class the device left, which the NIC lacks (HTB would send the
// packet unclassified, ahead of every class). On the device itself
// nic_egress leaves the NIC's choice alone (tc_index zero here: no class).
func TestRateShapeSendsAPodThroughTheShapingDeviceThenItsPathClass(t *testing.T) {
	const lo, shaper = 1, 4545
	const podClass, pathClass, viaIFB, fromIFB, untouched = 0x6d701005, 0x6d700010, 0x6d700002, 0x6d700003, 7
	dp := rateBed(t, clientPod, RateConfig{Mode: RateShape, PerPod: 5_000_000, PerPath: map[uint32]uint64{1: 20_000_000}})
	if err := dp.SetNIC(lo, 1); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetShapeDevice(shaper); err != nil {
		t.Fatal(err)
	}
	if err := dp.SyncShapeClasses([]ShapeClass{{Rule: 0, Path: 1, Pod: clientPod, ClassID: podClass}, {Rule: 0, Path: 1, ClassID: pathClass}}); err != nil {
		t.Fatal(err)
	}
	run(t, dp.Program(HookPodEgress), syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
	data := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 2, Ack: 8,
		Flags: testpkt.ACK, Payload: make([]byte, 1400)}}.Bytes()
	const podIf, otherIf = 4242, 4343
	if err := dp.SyncPodInterfaces([]PodInterface{{Ifindex: podIf, Addr: clientPod}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		in   skbContext
		want uint32
	}{
		{"leaving the NIC", skbContext{IngressIfindex: podIf, Priority: untouched}, viaIFB},
		{"given back by the shaping device", skbContext{IngressIfindex: shaper, Priority: podClass}, pathClass},
		// An unselected pod (or transit) that writes the subflow's
		// 4-tuple never takes a place in the pod's queue.
		{"the subflow's 4-tuple from another interface", skbContext{IngressIfindex: otherIf, Priority: untouched}, untouched},
	} {
		c.in.Ifindex = lo
		if ret, out := runIn(t, dp.Program(HookNICEgress), data, c.in); ret != tcxNext || out.Priority != c.want {
			t.Errorf("%s: verdict %d, priority %#x, want %#x", c.name, int32(ret), out.Priority, c.want)
		}
	}
	// No path class for the rule: a subflow's packet and one no subflow
	// entry names (UDP) go to the class for what the device gives back.
	if err := dp.SyncShapeClasses([]ShapeClass{{Rule: 0, Path: 1, Pod: clientPod, ClassID: podClass}}); err != nil {
		t.Fatal(err)
	}
	udp := testpkt.Frame{Src: clientPod, Dst: serverPod, Protocol: 17, Payload: make([]byte, 100)}.Bytes()
	for name, frame := range map[string][]byte{"subflow": data, "UDP": udp} {
		if ret, out := runIn(t, dp.Program(HookNICEgress), frame, skbContext{IngressIfindex: shaper, Ifindex: lo, Priority: podClass}); ret != tcxNext || out.Priority != fromIFB {
			t.Errorf("%s given back without a path class: verdict %d, priority %#x, want %#x", name, int32(ret), out.Priority, fromIFB)
		}
	}
	// A test run's device must exist: loopback plays the shaping device.
	if err := dp.SetShapeDevice(lo); err != nil {
		t.Fatal(err)
	}
	if ret, out := runIn(t, dp.Program(HookNICEgress), data, skbContext{IngressIfindex: podIf, Ifindex: lo, Priority: viaIFB}); ret != tcxNext || out.Priority != viaIFB {
		t.Errorf("on the shaping device: verdict %d, priority %#x, want %#x left", int32(ret), out.Priority, viaIFB)
	}
}

// A namespace's police bucket is one for all its pods on the node: what
// one pod sends (UDP, policed where it leaves the NIC) empties it for the
// other's subflow, under a rule that caps namespaces and not pods. Pods of
// two namespaces have a bucket each.
func TestRatePoliceNamespaceBucketIsSharedByItsPods(t *testing.T) {
	// 80 kbit/s: a packet's worth of tokens takes 145 ms to come back.
	const rateBps, burst = 80_000, 64 << 10
	const lo, podIf = 1, 4242
	other := netip.MustParseAddr("10.244.1.12")
	for _, tc := range []struct {
		name      string
		otherNS   uint32
		wantDrop2 bool
	}{
		{"one namespace", 1, true},
		{"two namespaces", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp := rateBed(t, clientPod, RateConfig{Mode: RatePolice, PerNamespace: 10 * rateBps, Directions: Egress})
			if err := dp.SetEndpoint(other, 0); err != nil {
				t.Fatal(err)
			}
			if err := dp.SetNIC(lo, 1); err != nil {
				t.Fatal(err)
			}
			if err := dp.SyncPodInterfaces([]PodInterface{{Ifindex: podIf, Addr: clientPod}}); err != nil {
				t.Fatal(err)
			}
			// The namespace's rate, not the rule's, is the bucket's.
			if err := dp.SyncPodNamespaces([]PodNamespace{{Pod: clientPod, ID: 1, Bps: rateBps, BurstBytes: burst},
				{Pod: other, ID: tc.otherNS, Bps: rateBps, BurstBytes: burst}}); err != nil {
				t.Fatal(err)
			}
			udp := testpkt.Frame{Src: clientPod, Dst: serverPod, Protocol: 17, Payload: make([]byte, 1400)}.Bytes()
			dropped := false
			for i := 0; i < 2*burst/1400 && !dropped; i++ {
				ret, _ := runIn(t, dp.Program(HookNICEgress), udp, skbContext{IngressIfindex: podIf, Ifindex: lo})
				dropped = ret == tcActShot
			}
			if !dropped {
				t.Fatal("the first pod's UDP was never policed by its namespace's bucket")
			}
			egress := dp.Program(HookPodEgress)
			run(t, egress, syn(other, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
			data := testpkt.Frame{Src: other, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 2, Ack: 8,
				Flags: testpkt.ACK, Payload: make([]byte, 1400)}}.Bytes()
			ret, _ := runOut(t, egress, data)
			if dropped2 := ret == tcActShot; dropped2 != tc.wantDrop2 {
				t.Errorf("the second pod's first packet dropped: %v, want %v", dropped2, tc.wantDrop2)
			}
			// Without its namespace entry a pod is charged to no
			// namespace bucket.
			if err := dp.SyncPodNamespaces(nil); err != nil {
				t.Fatal(err)
			}
			if ret, _ := runOut(t, egress, data); ret == tcActShot {
				t.Error("a pod with no namespace entry was policed")
			}
		})
	}
}
