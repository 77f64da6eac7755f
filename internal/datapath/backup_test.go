package datapath

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// joinB is the MP_JOIN B bit of a frame built by testpkt (the join the
// only MPTCP option, after no other), read by hand; tshark reads it too.
func joinB(t *testing.T, frame []byte) bool {
	t.Helper()
	opts := frame[tcpOffset(frame)+20:]
	for i := 0; i+2 < len(opts); {
		switch opts[i] {
		case 0:
			t.Fatal("no MP_JOIN in the frame")
		case 1:
			i++
			continue
		}
		if opts[i] == 30 && opts[i+2]>>4 == 1 {
			return opts[i+2]&1 == 1
		}
		i += int(opts[i+1])
	}
	t.Fatal("no MP_JOIN in the frame")
	return false
}

// backupBed: rule 0 spreads local over active paths 1 and 2 with path 3 as
// its backup path, headers may be rewritten.
func backupBed(t *testing.T, local netip.Addr) *Datapath {
	t.Helper()
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}, Backup: []uint32{3}, RewriteHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(local, 0); err != nil {
		t.Fatal(err)
	}
	return dp
}

// A connection the pod opens: its first subflow only ever takes an active
// path, its joins take the active paths first and then the backup path, and
// the SYN-ACK answering the join on the backup path is the one packet that
// gets the B bit on its way into the pod: not the SYN-ACK of the join on an
// active path, not the MP_CAPABLE SYN-ACK, not data. tshark reads the B bit
// and finds the rewritten packet's checksums good, IPv4 and IPv6, with the
// B bit's byte first or second in its 16-bit word of the TCP header (a NOP
// before the MP_JOIN moves it).
func TestBackupFlagsTheJoinSYNACKIntoThePodOnBackupPathsOnly(t *testing.T) {
	type family struct {
		name           string
		client, server netip.Addr
	}
	for _, fam := range []family{
		{"IPv4", clientPod, serverPod},
		{"IPv6", netip.MustParseAddr("fd00:244:1::11"), netip.MustParseAddr("fd00:244:2::11")},
		{"IPv4, B bit at an odd offset", clientPod, serverPod},
		{"IPv6, B bit at an odd offset", netip.MustParseAddr("fd00:244:1::11"), netip.MustParseAddr("fd00:244:2::11")},
	} {
		var lead []byte
		if strings.HasSuffix(fam.name, "odd offset") {
			lead = testpkt.NOP()
		}
		t.Run(fam.name, func(t *testing.T) {
			dp := backupBed(t, fam.client)
			egress, ingress := dp.Program(HookPodEgress), dp.Program(HookPodIngress)
			const clientKey, serverKey = 0x0a0b0c0d0e0f1011, 0x0102030405060708
			// Several connections: round robin never starts one on
			// the backup path.
			for c := uint16(0); c < 4; c++ {
				p := dp.pathOfMark(t, run(t, egress, syn(fam.client, 41000+c, fam.server, 5201, testpkt.MPCapableSYN()), skbContext{}))
				if p == 3 {
					t.Fatalf("connection %d started on the backup path", c)
				}
			}
			first := dp.pathOfMark(t, run(t, egress, syn(fam.client, 40000, fam.server, 5201, testpkt.MPCapableSYN()), skbContext{}))
			capSynAck := synAck(fam.server, 5201, fam.client, 40000, testpkt.MPCapableSYNACK(serverKey))
			if _, out := runOut(t, ingress, capSynAck); string(out) != string(capSynAck) {
				t.Error("the MP_CAPABLE SYN-ACK was changed")
			}
			run(t, egress, capableACK(fam.client, 40000, fam.server, 5201, clientKey, serverKey), skbContext{})

			var rewritten [][]byte
			for j, want := range []uint32{3 - first, 3} {
				sport := uint16(40001 + j)
				joinSyn := syn(fam.client, sport, fam.server, 5201, testpkt.MPJoinSYN(tokenOf(serverKey), 7, uint8(j+1), false))
				if p := dp.pathOfMark(t, run(t, egress, joinSyn, skbContext{})); p != want {
					t.Fatalf("join %d placed on path %d, want %d (active paths before the backup one)", j+1, p, want)
				}
				sa := synAck(fam.server, 5201, fam.client, sport, testpkt.Join(lead, testpkt.MPJoinSYNACK(0x1122334455667788, 9, 0, false)))
				_, out := runOut(t, ingress, sa)
				if want != 3 {
					if string(out) != string(sa) {
						t.Errorf("the SYN-ACK of the join on active path %d was changed", want)
					}
					continue
				}
				if !joinB(t, out) {
					t.Fatal("the SYN-ACK of the join on the backup path has no B bit")
				}
				// Only the B bit changed (and the checksum, bytes 16-17 of TCP).
				diff := 0
				for i := range sa {
					if sa[i] != out[i] {
						diff++
					}
				}
				if diff < 1 || diff > 3 {
					t.Errorf("%d bytes changed, want the option byte and the checksum", diff)
				}
				rewritten = append(rewritten, out)
				// Data into the pod on that subflow is left alone.
				data := testpkt.Frame{Src: fam.server, Dst: fam.client, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: sport, Seq: 8, Ack: 2,
					Flags: testpkt.ACK, Options: testpkt.DSS{DataACK: u64(1)}.Bytes(), Payload: make([]byte, 100)}}.Bytes()
				if _, out := runOut(t, ingress, data); string(out) != string(data) {
					t.Error("data into the pod on the backup subflow was changed")
				}
			}
			decoded := tsharkDecode(t, rewritten, []string{"ip.checksum.status", "tcp.checksum.status", "tcp.options.mptcp.backup.flag"})
			for _, d := range decoded {
				if fam.name == "IPv4" && d["ip.checksum.status"] != tsharkGood {
					t.Errorf("tshark: IP checksum status %q", d["ip.checksum.status"])
				}
				if d["tcp.checksum.status"] != tsharkGood {
					t.Errorf("tshark: TCP checksum status %q", d["tcp.checksum.status"])
				}
				if d["tcp.options.mptcp.backup.flag"] != "1" {
					t.Errorf("tshark: backup flag %q, want 1", d["tcp.options.mptcp.backup.flag"])
				}
			}
			if n := stat(t, dp, StatBackupFlagged); n != 1 {
				t.Errorf("StatBackupFlagged = %d, want 1", n)
			}
		})
	}
}

// A join the peer opens, arriving on the NIC of the backup path: its SYN gets
// the B bit on its way into the pod; one arriving on an active path's NIC
// does not. In observe-only mode nothing is rewritten and the would-be
// rewrite is counted.
func TestBackupFlagsTheRemoteJoinSYNOnTheBackupPathsNIC(t *testing.T) {
	dp := backupBed(t, serverPod)
	const nicActive, nicBackup = 6, 7
	if err := dp.SetNIC(nicActive, 1); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetNIC(nicBackup, 3); err != nil {
		t.Fatal(err)
	}
	ingress := dp.Program(HookPodIngress)
	arrive := func(sport uint16, ifindex uint32) ([]byte, []byte) {
		join := syn(clientPod, sport, serverPod, 5201, testpkt.MPJoinSYN(0x01020304, 5, 2, false))
		run(t, dp.objs.NicIngress, join, skbContext{IngressIfindex: ifindex})
		_, out := runOut(t, ingress, join)
		return join, out
	}
	if in, out := arrive(45000, nicActive); string(in) != string(out) {
		t.Error("a join arriving on an active path was changed")
	}
	_, out := arrive(45001, nicBackup)
	if !joinB(t, out) {
		t.Fatal("a join arriving on the backup path has no B bit on its way into the pod")
	}
	d := tsharkDecode(t, [][]byte{out}, []string{"tcp.checksum.status", "tcp.options.mptcp.backup.flag"})[0]
	if d["tcp.checksum.status"] != tsharkGood || d["tcp.options.mptcp.backup.flag"] != "1" {
		t.Errorf("tshark: %v, want a good checksum and backup flag 1", d)
	}
	// The SYN waited for the pod's answer and the third ACK: the entry
	// they write is the backup subflow the actor made it.
	completeFromWire(t, dp, netip.AddrPortFrom(clientPod, 45001), netip.AddrPortFrom(serverPod, 5201), 1, true, nicBackup)
	if sf := lookupSubflow(t, dp, flowKey(netip.AddrPortFrom(serverPod, 5201), netip.AddrPortFrom(clientPod, 45001))); sf.Flags&1 == 0 /* SUBFLOW_BACKUP */ || sf.PathIndex != 3 {
		t.Errorf("the backup join's entry is %+v, want it flagged backup, on path 3", sf)
	}

	if err := dp.SetObserveOnly(true); err != nil {
		t.Fatal(err)
	}
	observed := stat(t, dp, StatObserved)
	if in, out := arrive(45002, nicBackup); string(in) != string(out) {
		t.Error("observe-only: the join was changed")
	}
	if stat(t, dp, StatObserved) <= observed {
		t.Error("observe-only: the rewrite it would have made was not counted")
	}
	if n := stat(t, dp, StatBackupFlagged); n != 1 {
		t.Errorf("StatBackupFlagged = %d, want 1 (none in observe-only mode)", n)
	}
}

// The first subflow takes a backup path only when every active path is down.
func TestBackupPathTakesTheFirstSubflowOnlyWhenActivePathsAreDown(t *testing.T) {
	dp := backupBed(t, clientPod)
	for _, p := range []uint32{1, 2} {
		if err := dp.SetPathDown(p, true); err != nil {
			t.Fatal(err)
		}
	}
	if p := dp.pathOfMark(t, run(t, dp.Program(HookPodEgress), syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})); p != 3 {
		t.Fatalf("with both active paths down the connection started on path %d, want the backup path 3", p)
	}
}

// A rule refuses backup paths without the header-rewriting opt-in, and a
// path both active and backup.
func TestBackupRuleValidation(t *testing.T) {
	for name, r := range map[string]Rule{
		"no opt-in":         {Paths: []uint32{1}, Backup: []uint32{2}},
		"active and backup": {Paths: []uint32{1, 2}, Backup: []uint32{2}, RewriteHeaders: true},
	} {
		if err := r.Validate(); err == nil {
			t.Errorf("%s: %+v accepted", name, r)
		} else if name == "no opt-in" && !strings.Contains(err.Error(), "header-rewriting") {
			t.Errorf("%s: error %q does not name the opt-in", name, err)
		}
	}
}

// serverKey is the server's MPTCP key of the connection openConnection
// opens: its joins carry tokenOf(serverKey).
const serverKey = 0x0102030405060708

// openConnection opens an MPTCP connection from client:40000 to
// server:5201 through dp's pod_egress (SYN, then the MP_CAPABLE ACK with
// both keys) and returns the path its first subflow took.
func openConnection(t *testing.T, dp *Datapath, client, server netip.Addr) uint32 {
	t.Helper()
	egress := dp.Program(HookPodEgress)
	first := dp.pathOfMark(t, run(t, egress, syn(client, 40000, server, 5201, testpkt.MPCapableSYN()), skbContext{}))
	run(t, egress, capableACK(client, 40000, server, 5201, 0x0a0b0c0d0e0f1011, serverKey), skbContext{})
	return first
}

// pureACK is an ACK from server to client with timestamps and a DSS
// DATA_ACK and no data, as a peer acknowledges what the pod sent.
func pureACK(server, client netip.Addr, dport uint16, extra ...[]byte) []byte {
	opts := testpkt.Join(append([][]byte{testpkt.NOP(), testpkt.NOP(), testpkt.Timestamps(100, 200), testpkt.DSS{DataACK: u64(5000)}.Bytes()}, extra...)...)
	return testpkt.Frame{Src: server, Dst: client, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: dport, Seq: 8, Ack: 2, Flags: testpkt.ACK, Options: opts}}.Bytes()
}

// A subflow whose path becomes a backup path after its join hears so from
// an MP_PRIO (v1, length 3, B=1) added to the next pure ACK going into the
// pod, and hears the reverse (B=0) once the path is active again: once per
// change, never on a packet with data, and not when the ACK's options are
// full (counted). The grown packet's lengths and checksums are right, as
// tshark decodes them, IPv4 and IPv6.
func TestBackupMPPrioTellsThePodOfARoleChangeOnPureACKsOnly(t *testing.T) {
	for _, fam := range []struct {
		name           string
		client, server netip.Addr
	}{
		{"IPv4", clientPod, serverPod},
		{"IPv6", netip.MustParseAddr("fd00:244:1::11"), netip.MustParseAddr("fd00:244:2::11")},
	} {
		t.Run(fam.name, func(t *testing.T) {
			dp := backupBed(t, fam.client)
			egress, ingress := dp.Program(HookPodEgress), dp.Program(HookPodIngress)
			first := openConnection(t, dp, fam.client, fam.server)
			const sport = 40001
			join := syn(fam.client, sport, fam.server, 5201, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false))
			active := dp.pathOfMark(t, run(t, egress, join, skbContext{}))
			if active != 3-first {
				t.Fatalf("join placed on path %d, want the other active path %d", active, 3-first)
			}
			sa := synAck(fam.server, 5201, fam.client, sport, testpkt.MPJoinSYNACK(0x1122334455667788, 9, 0, false))
			if _, out := runOut(t, ingress, sa); string(out) != string(sa) {
				t.Fatal("the join on an active path was flagged")
			}
			ack := pureACK(fam.server, fam.client, sport)
			if _, out := runOut(t, ingress, ack); string(out) != string(ack) {
				t.Fatal("a pure ACK on an unchanged active subflow was changed")
			}

			// The join's path becomes a backup path.
			if err := dp.SetRule(0, Rule{Paths: []uint32{first}, Backup: []uint32{active, 3}, RewriteHeaders: true}); err != nil {
				t.Fatal(err)
			}
			data := testpkt.Frame{Src: fam.server, Dst: fam.client, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: sport, Seq: 8, Ack: 2,
				Flags: testpkt.ACK, Options: testpkt.DSS{DataACK: u64(1)}.Bytes(), Payload: make([]byte, 100)}}.Bytes()
			if _, out := runOut(t, ingress, data); string(out) != string(data) {
				t.Error("a packet with data got changed")
			}
			// NOPs fill the options to 40 bytes: no room for MP_PRIO.
			base := len(ack) - tcpOffset(ack) - 20
			nops := make([]byte, 40-base)
			for i := range nops {
				nops[i] = 1
			}
			full := pureACK(fam.server, fam.client, sport, nops)
			if got := len(full) - tcpOffset(full) - 20; got != 40 {
				t.Fatalf("test frame has %d bytes of options, want 40", got)
			}
			if _, out := runOut(t, ingress, full); string(out) != string(full) {
				t.Error("an ACK with full options was changed")
			}
			if n := stat(t, dp, StatBackupPrioNoRoom); n != 1 {
				t.Errorf("StatBackupPrioNoRoom = %d, want 1", n)
			}
			_, toBackup := runOut(t, ingress, ack)
			if _, again := runOut(t, ingress, ack); string(again) != string(ack) {
				t.Error("MP_PRIO sent twice for one change")
			}

			// Active again.
			if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}, Backup: []uint32{3}, RewriteHeaders: true}); err != nil {
				t.Fatal(err)
			}
			_, toActive := runOut(t, ingress, ack)

			for i, c := range []struct {
				out []byte
				b   string
			}{{toBackup, "1"}, {toActive, "0"}} {
				if len(c.out) != len(ack)+4 {
					t.Fatalf("MP_PRIO %d: %d bytes, want the ACK's %d + 4", i+1, len(c.out), len(ack))
				}
				hdr := len(ack) - tcpOffset(ack)
				opt := c.out[tcpOffset(c.out)+hdr : tcpOffset(c.out)+hdr+4]
				if want := []byte{30, 3, 0x50 | map[string]byte{"1": 1, "0": 0}[c.b], 1}; string(opt) != string(want) {
					t.Errorf("MP_PRIO %d: option bytes % x, want % x (kind 30, length 3, subtype 5, B, then a NOP)", i+1, opt, want)
				}
			}
			decoded := tsharkDecode(t, [][]byte{toBackup, toActive}, []string{"ip.checksum.status", "tcp.checksum.status",
				"tcp.hdr_len", "tcp.options.mptcp.subtype", "tcp.options.mptcp.backup.flag", "tcp.len"})
			for i, d := range decoded {
				if fam.name == "IPv4" && d["ip.checksum.status"] != tsharkGood {
					t.Errorf("MP_PRIO %d: tshark: IP checksum status %q", i+1, d["ip.checksum.status"])
				}
				if want := fmt.Sprint(len(ack) - tcpOffset(ack) + 4); d["tcp.checksum.status"] != tsharkGood || d["tcp.hdr_len"] != want || d["tcp.len"] != "0" {
					t.Errorf("MP_PRIO %d: tshark: %v, want a good checksum, a %s-byte header and no data", i+1, d, want)
				}
				if d["tcp.options.mptcp.subtype"] != "2,5" || d["tcp.options.mptcp.backup.flag"] != []string{"1", "0"}[i] {
					t.Errorf("MP_PRIO %d: tshark: subtypes %q backup %q, want DSS and MP_PRIO with B=%s", i+1,
						d["tcp.options.mptcp.subtype"], d["tcp.options.mptcp.backup.flag"], []string{"1", "0"}[i])
				}
			}
			if n := stat(t, dp, StatBackupPrioSent); n != 2 {
				t.Errorf("StatBackupPrioSent = %d, want 2", n)
			}
		})
	}
}

// When the admin withdraws a rule's header-rewriting opt-in (and so its
// backup paths), the backup actor takes back what it did and nothing else: a
// subflow the datapath made backup (here by an MP_PRIO) hears B=0 on its next
// pure ACK, once; a subflow whose peer flagged its own join backup keeps it.
func TestBackupWithdrawnOptInUndoesOnlyWhatTheDatapathDid(t *testing.T) {
	dp := backupBed(t, clientPod)
	egress, ingress := dp.Program(HookPodEgress), dp.Program(HookPodIngress)
	first := openConnection(t, dp, clientPod, serverPod)
	joinOn := func(sport uint16, peerFlagsBackup bool) uint32 {
		path := dp.pathOfMark(t, run(t, egress, syn(clientPod, sport, serverPod, 5201, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false)), skbContext{}))
		sa := synAck(serverPod, 5201, clientPod, sport, testpkt.MPJoinSYNACK(0x1122334455667788, 9, 0, peerFlagsBackup))
		if _, out := runOut(t, ingress, sa); string(out) != string(sa) {
			t.Fatalf("join %d on path %d: its SYN-ACK was changed", sport, path)
		}
		return path
	}
	// The first join takes the other active path, the second the backup
	// path, and its peer flagged it backup itself.
	if path := joinOn(40001, false); path != 3-first {
		t.Fatalf("join placed on path %d, want the other active path %d", path, 3-first)
	}
	if path := joinOn(40002, true); path != 3 {
		t.Fatalf("second join placed on path %d, want the backup path 3", path)
	}
	ours, peers := pureACK(serverPod, clientPod, 40001), pureACK(serverPod, clientPod, 40002)

	// The first join's path becomes a backup path: the datapath tells the
	// pod so.
	if err := dp.SetRule(0, Rule{Paths: []uint32{first}, Backup: []uint32{3 - first, 3}, RewriteHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if _, out := runOut(t, ingress, ours); len(out) != len(ours)+4 || out[len(out)-2] != 0x51 {
		t.Fatalf("no MP_PRIO B=1 on the first join's ACK after its path became backup: % x", out[len(out)-4:])
	}
	if _, out := runOut(t, ingress, peers); string(out) != string(peers) {
		t.Fatal("the subflow its peer made backup got an MP_PRIO")
	}

	// The opt-in is withdrawn, with the backup paths.
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	_, undone := runOut(t, ingress, ours)
	if len(undone) != len(ours)+4 {
		t.Fatalf("no MP_PRIO on the first join's ACK after the opt-in was withdrawn (%d bytes, want %d)", len(undone), len(ours)+4)
	}
	d := tsharkDecode(t, [][]byte{undone}, []string{"tcp.checksum.status", "tcp.options.mptcp.subtype", "tcp.options.mptcp.backup.flag"})[0]
	if d["tcp.checksum.status"] != tsharkGood || d["tcp.options.mptcp.subtype"] != "2,5" || d["tcp.options.mptcp.backup.flag"] != "0" {
		t.Errorf("tshark on the undoing ACK: %v, want a good checksum and MP_PRIO with B=0 after the DSS", d)
	}
	if _, again := runOut(t, ingress, ours); string(again) != string(ours) {
		t.Error("the undoing MP_PRIO was sent twice")
	}
	if _, out := runOut(t, ingress, peers); string(out) != string(peers) {
		t.Error("the subflow its peer made backup got an MP_PRIO after the opt-in was withdrawn")
	}
	if n := stat(t, dp, StatBackupPrioSent); n != 2 {
		t.Errorf("StatBackupPrioSent = %d, want 2 (B=1, then B=0)", n)
	}
}

// An MP_PRIO with B=0 going into the pod cannot make a subflow on a backup
// path active there, under the header-rewriting opt-in: its B is set again
// (the checksum follows, tshark), and the datapath then holds the subflow as
// backup by its own doing. A peer's path manager sends one when it makes a
// join it held active (docs/subflows.md, "Held joins"). On an active path, or
// without the opt-in, an MP_PRIO passes byte for byte.
func TestBackupMPPrioIntoThePodKeepsABackupPathBackup(t *testing.T) {
	dp := backupBed(t, clientPod)
	egress, ingress := dp.Program(HookPodEgress), dp.Program(HookPodIngress)
	first := openConnection(t, dp, clientPod, serverPod)
	joinOn := func(sport uint16) uint32 {
		return dp.pathOfMark(t, run(t, egress, syn(clientPod, sport, serverPod, 5201, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, true)), skbContext{}))
	}
	if path := joinOn(40001); path != 3-first {
		t.Fatalf("first join placed on path %d, want the other active path %d", path, 3-first)
	}
	if path := joinOn(40002); path != 3 {
		t.Fatalf("second join placed on path %d, want the backup path 3", path)
	}
	for _, sport := range []uint16{40001, 40002} {
		sa := synAck(serverPod, 5201, clientPod, sport, testpkt.MPJoinSYNACK(0x1122334455667788, 9, 0, false))
		runOut(t, ingress, sa)
	}
	flagged := stat(t, dp, StatBackupFlagged)

	activeRelease := pureACK(serverPod, clientPod, 40001, testpkt.MPPrio(false))
	if _, out := runOut(t, ingress, activeRelease); string(out) != string(activeRelease) {
		t.Error("an MP_PRIO B=0 on an active path was changed")
	}
	backupRelease := pureACK(serverPod, clientPod, 40002, testpkt.MPPrio(false))
	_, kept := runOut(t, ingress, backupRelease)
	if len(kept) != len(backupRelease) {
		t.Fatalf("the MP_PRIO on the backup path came out %d bytes long, want %d: rewritten in place", len(kept), len(backupRelease))
	}
	d := tsharkDecode(t, [][]byte{kept}, []string{"tcp.checksum.status", "tcp.options.mptcp.subtype", "tcp.options.mptcp.backup.flag"})[0]
	if d["tcp.checksum.status"] != tsharkGood || d["tcp.options.mptcp.subtype"] != "2,5" || d["tcp.options.mptcp.backup.flag"] != "1" {
		t.Errorf("tshark on the MP_PRIO into the pod on the backup path: %v, want a good checksum and B=1", d)
	}
	if n := stat(t, dp, StatBackupFlagged); n != flagged+1 {
		t.Errorf("StatBackupFlagged = %d, want %d", n, flagged+1)
	}
	// A peer that sends B=1, then B=0, in one segment: one kernel obeys the
	// last MP_PRIO, another the first, and no stack sends two, so the
	// segment is dropped rather than either rewritten.
	twice := pureACK(serverPod, clientPod, 40002, testpkt.MPPrio(true), testpkt.MPPrio(false), testpkt.NOP(), testpkt.NOP())
	if ret, _ := runVerdict(t, ingress, twice, skbContext{}); ret != tcActShot {
		t.Errorf("two MP_PRIOs into the pod on the backup path: verdict %d, want TC_ACT_SHOT", int32(ret))
	}
	// The datapath made it backup: the pod is told so on no further ACK,
	// and when the opt-in is withdrawn it is undone.
	ack := pureACK(serverPod, clientPod, 40002)
	if _, out := runOut(t, ingress, ack); string(out) != string(ack) {
		t.Error("a pure ACK after the kept MP_PRIO got another MP_PRIO")
	}
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if _, out := runOut(t, ingress, backupRelease); string(out) != string(backupRelease) {
		t.Error("an MP_PRIO was changed without the header-rewriting opt-in")
	}
	if _, out := runOut(t, ingress, ack); len(out) != len(ack)+4 || out[len(out)-2] != 0x50 {
		t.Errorf("no MP_PRIO B=0 undoing the kept backup once the opt-in was withdrawn: % x", out[len(out)-4:])
	}
}

// A rule that allows its connections no join (maxSubflows 1) turns an
// ADD_ADDR going into its pod into NOPs: the option block keeps its length,
// nothing else changes, the checksum stays right (tshark), and tshark no
// longer finds an ADD_ADDR. Under a rule that allows joins, or without the
// header-rewriting opt-in, the packet passes byte for byte.
func TestBlockTurnsADDADDRIntoNOPsWhenNoJoinIsAllowed(t *testing.T) {
	for _, c := range []struct {
		name    string
		addAddr []byte
	}{
		{"IPv4 address with port", testpkt.AddAddr(3, netip.MustParseAddr("10.244.2.12"), 5301, false, 0x1122334455667788)},
		{"IPv6 address, echo", testpkt.AddAddr(4, netip.MustParseAddr("fd00:244:2::12"), 0, true, 0)},
	} {
		t.Run(c.name, func(t *testing.T) {
			dp := loadForTest(t)
			rule := Rule{Paths: []uint32{1, 2}, MaxSubflows: 1, RewriteHeaders: true}
			if err := dp.SetRule(0, rule); err != nil {
				t.Fatal(err)
			}
			if err := dp.SetEndpoint(clientPod, 0); err != nil {
				t.Fatal(err)
			}
			run(t, dp.Program(HookPodEgress), syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
			ack := testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: 40000, Seq: 8, Ack: 2, Flags: testpkt.ACK,
				Options: testpkt.Join(testpkt.DSS{DataACK: u64(1)}.Bytes(), c.addAddr)}}.Bytes()
			ingress := dp.Program(HookPodIngress)
			_, out := runOut(t, ingress, ack)
			if len(out) != len(ack) {
				t.Fatalf("%d bytes out, %d in: the option block must keep its length", len(out), len(ack))
			}
			// The ADD_ADDR's bytes are NOPs; every other byte but the
			// checksum is as it was.
			opts := tcpOffset(ack) + 20
			dssLen := len(testpkt.DSS{DataACK: u64(1)}.Bytes())
			for i := range ack {
				switch {
				case i == tcpOffset(ack)+16 || i == tcpOffset(ack)+17:
				case i >= opts+dssLen && i < opts+dssLen+len(c.addAddr):
					if out[i] != 1 {
						t.Fatalf("byte %d of the ADD_ADDR is %#x, want a NOP", i-opts-dssLen, out[i])
					}
				case out[i] != ack[i]:
					t.Fatalf("byte %d changed (%#x -> %#x), outside the ADD_ADDR", i, ack[i], out[i])
				}
			}
			d := tsharkDecode(t, [][]byte{out}, []string{"tcp.checksum.status", "tcp.options.mptcp.subtype", "tcp.hdr_len"})[0]
			if d["tcp.checksum.status"] != tsharkGood || d["tcp.options.mptcp.subtype"] != "2" || d["tcp.hdr_len"] != fmt.Sprint(len(ack)-tcpOffset(ack)) {
				t.Errorf("tshark: %v, want a good checksum, the DSS alone, the same header length", d)
			}
			if n := stat(t, dp, StatAddAddrBlocked); n != 1 {
				t.Errorf("StatAddAddrBlocked = %d, want 1", n)
			}

			for _, other := range []Rule{
				{Paths: []uint32{1, 2}, MaxSubflows: 2, RewriteHeaders: true},
				{Paths: []uint32{1, 2}, MaxSubflows: 1},
			} {
				if err := dp.SetRule(0, other); err != nil {
					t.Fatal(err)
				}
				if _, out := runOut(t, ingress, ack); string(out) != string(ack) {
					t.Errorf("rule %+v: the ADD_ADDR was changed", other)
				}
			}
		})
	}
}

// A peer's join beyond its rule's maximum (2 subflows: the first and one
// join), or arriving on a blocked path, is answered at the NIC: the SYN becomes a reset with
// MP_TCPRST reason 3 ("administratively prohibited"), addresses, ports and
// MACs swapped, ACK the SYN's sequence + 1, valid checksums (tshark), sent
// back out of the NIC it came in on (TC_ACT_REDIRECT), counted, and not
// mirrored. The join within the maximum passes. IPv4 and IPv6, each also
// with IP options or extension headers, which the reset goes without; a join
// with options behind a VLAN tag in the frame cannot be cut and passes.
func TestBlockAnswersARefusedJoinWithMPTCPRST(t *testing.T) {
	v6Client, v6Server := netip.MustParseAddr("fd00:244:1::11"), netip.MustParseAddr("fd00:244:2::11")
	for _, fam := range []struct {
		name           string
		client, server netip.Addr
		// The SYN's IP options or extension headers: the reset goes
		// without them.
		ipv4Options  []byte
		hopByHop     bool
		destOptsHdrs int
	}{
		{name: "IPv4", client: clientPod, server: serverPod},
		{name: "IPv6", client: v6Client, server: v6Server},
		// Record route (RFC 791 3.1): 4 empty slots.
		{name: "IPv4 with options", client: clientPod, server: serverPod, ipv4Options: []byte{7, 19, 4}},
		{name: "IPv6 with extension headers", client: v6Client, server: v6Server, hopByHop: true, destOptsHdrs: 1},
	} {
		t.Run(fam.name, func(t *testing.T) {
			dp := loadForTest(t)
			if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}, MaxSubflows: 2}); err != nil {
				t.Fatal(err)
			}
			if err := dp.SetEndpoint(fam.server, 0); err != nil {
				t.Fatal(err)
			}
			const nic1, nic2 = 6, 7
			for i, ifindex := range []int{nic1, nic2} {
				if err := dp.SetNIC(ifindex, uint32(i+1)); err != nil {
					t.Fatal(err)
				}
			}
			const clientKey, serverKey = 0x0a0b0c0d0e0f1011, 0x0102030405060708
			nicIn := func(frame []byte, ifindex uint32) (uint32, []byte) {
				opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256),
					Context: skbContext{IngressIfindex: ifindex}, ContextOut: &skbContext{}}
				ret, err := dp.objs.NicIngress.Run(opts)
				if err != nil {
					t.Fatal(err)
				}
				return ret, opts.DataOut
			}
			// The connection, as the server's node sees it arrive.
			server := netip.AddrPortFrom(fam.server, 5201)
			acceptFromWire(t, dp, netip.AddrPortFrom(fam.client, 40000), server, testpkt.MPCapableSYN(), nic1, clientKey, serverKey)
			join := func(sport uint16) []byte {
				opts := fam.ipv4Options
				if opts != nil {
					opts = append(append([]byte{}, opts...), make([]byte, 16)...) // the route's slots
				}
				return testpkt.Frame{Src: fam.client, Dst: fam.server, IPv4Options: opts, IPv6HopByHop: fam.hopByHop, IPv6DestOpts: fam.destOptsHdrs,
					TCP: &testpkt.TCP{SrcPort: sport, DstPort: 5201, Seq: 1000, Flags: testpkt.SYN, Options: testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false)}}.Bytes()
			}
			// The join within the maximum passes, and so does its
			// retransmitted SYN: it is not counted twice.
			for range 2 {
				if ret, out := nicIn(join(40001), nic2); ret != tcxNext || string(out) != string(join(40001)) {
					t.Fatalf("the join within the maximum: verdict %d, changed %v; want it passed unchanged", int32(ret), string(out) != string(join(40001)))
				}
				completeFromWire(t, dp, netip.AddrPortFrom(fam.client, 40001), server, 1000, true, nic2)
			}
			ret, rst := nicIn(join(40002), nic2)
			if ret != tcActRedirect {
				t.Fatalf("the join beyond the maximum: verdict %d, want TC_ACT_REDIRECT back out", int32(ret))
			}
			in := join(40002)
			if string(rst[0:6]) != string(in[6:12]) || string(rst[6:12]) != string(in[0:6]) {
				t.Error("MACs not swapped")
			}
			d := tsharkDecode(t, [][]byte{rst}, []string{"ip.checksum.status", "tcp.checksum.status", "ip.src", "ipv6.src", "tcp.srcport", "tcp.dstport",
				"tcp.flags.reset", "tcp.flags.ack", "tcp.ack_raw", "tcp.seq_raw", "tcp.len", "tcp.options.mptcp.subtype", "tcp.options.mptcp.rst_reason",
				"ip.hdr_len", "ipv6.nxt", "ipv6.plen", "ip.len"})[0]
			src := d["ip.src"]
			if fam.server.Is6() {
				src = d["ipv6.src"]
				if d["ipv6.nxt"] != "6" || d["ipv6.plen"] != "24" {
					t.Errorf("tshark: IPv6 next header %q, payload length %q; want 6 (TCP, no extension header) and 24", d["ipv6.nxt"], d["ipv6.plen"])
				}
			} else {
				if d["ip.checksum.status"] != tsharkGood {
					t.Errorf("tshark: IP checksum status %q", d["ip.checksum.status"])
				}
				if d["ip.hdr_len"] != "20" || d["ip.len"] != "44" {
					t.Errorf("tshark: IP header length %q, total length %q; want 20 (no options) and 44", d["ip.hdr_len"], d["ip.len"])
				}
			}
			ipLen := 20
			if fam.server.Is6() {
				ipLen = 40
			}
			if want := 14 + ipLen + 24; len(rst) != want {
				t.Errorf("the reset is %d bytes, want %d (Ethernet, a bare IP header, TCP with MP_TCPRST)", len(rst), want)
			}
			want := map[string]string{"tcp.checksum.status": tsharkGood, "tcp.srcport": "5201", "tcp.dstport": "40002", "tcp.flags.reset": "1",
				"tcp.flags.ack": "1", "tcp.ack_raw": "1001", "tcp.seq_raw": "0", "tcp.len": "0", "tcp.options.mptcp.subtype": "8", "tcp.options.mptcp.rst_reason": "0x03"}
			for k, v := range want {
				if d[k] != v {
					t.Errorf("tshark: %s = %q, want %q", k, d[k], v)
				}
			}
			if src != fam.server.String() {
				t.Errorf("tshark: reset from %s, want the server pod %s", src, fam.server)
			}
			if n := stat(t, dp, StatJoinRefused); n != 1 {
				t.Errorf("StatJoinRefused = %d, want 1", n)
			}
			if fam.ipv4Options != nil {
				// Options behind a VLAN tag in the frame: the kernel
				// cannot cut them (it does not know the IP header), so
				// the join passes byte for byte and is not counted.
				tagged := testpkt.Frame{VLANs: []uint16{100}, Src: fam.client, Dst: fam.server, IPv4Options: append(append([]byte{}, fam.ipv4Options...), make([]byte, 16)...),
					TCP: &testpkt.TCP{SrcPort: 40005, DstPort: 5201, Seq: 1000, Flags: testpkt.SYN, Options: testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false)}}.Bytes()
				if ret, out := nicIn(tagged, nic2); ret != tcxNext || string(out) != string(tagged) {
					t.Errorf("a VLAN-tagged join with IP options: verdict %d, changed %v; want it passed unchanged", int32(ret), string(out) != string(tagged))
				}
				if n := stat(t, dp, StatJoinRefused); n != 1 {
					t.Errorf("StatJoinRefused = %d after the VLAN-tagged join, want 1", n)
				}
			}
			sfs, err := dp.Subflows()
			if err != nil {
				t.Fatal(err)
			}
			for _, sf := range sfs {
				if sf.Remote.Port() == 40002 {
					t.Error("the refused join was mirrored")
				}
			}

			// Without a maximum but with path 3 blocked: a join arriving
			// on path 3's NIC is refused the same way, one on path 2's
			// is let in.
			const nic3 = 8
			if err := dp.SetNIC(nic3, 3); err != nil {
				t.Fatal(err)
			}
			if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}, Blocked: []uint32{3}}); err != nil {
				t.Fatal(err)
			}
			if ret, _ := nicIn(join(40003), nic2); ret != tcxNext {
				t.Errorf("a join on an allowed path: verdict %d, want TCX_NEXT", int32(ret))
			}
			ret, rst = nicIn(join(40004), nic3)
			if ret != tcActRedirect {
				t.Fatalf("a join on the blocked path: verdict %d, want TC_ACT_REDIRECT", int32(ret))
			}
			d = tsharkDecode(t, [][]byte{rst}, []string{"tcp.checksum.status", "tcp.flags.reset", "tcp.options.mptcp.rst_reason"})[0]
			if d["tcp.checksum.status"] != tsharkGood || d["tcp.flags.reset"] != "1" || d["tcp.options.mptcp.rst_reason"] != "0x03" {
				t.Errorf("tshark on the blocked path's reset: %v", d)
			}
			if n := stat(t, dp, StatJoinRefused); n != 2 {
				t.Errorf("StatJoinRefused = %d, want 2", n)
			}
		})
	}
}

// A join the pod opens beyond its rule's maximum (2 subflows) is answered at
// its veth the way a peer's is at the NIC: the SYN becomes a reset with
// MP_TCPRST reason 3, from the peer to the pod, valid checksums (tshark),
// sent back into the pod (TC_ACT_REDIRECT), counted, and not placed. The
// join within the maximum, and its retransmitted SYN, pass.
func TestBlockAnswersThePodsJoinBeyondTheMaximum(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}, MaxSubflows: 2}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	egress := dp.objs.PodEgress
	const clientKey, serverKey = 0x0a0b0c0d0e0f1011, 0x0102030405060708
	run(t, egress, syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
	run(t, egress, capableACK(clientPod, 40000, serverPod, 5201, clientKey, serverKey), skbContext{})
	join := func(sport uint16) []byte {
		return testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: sport, DstPort: 5201, Seq: 1000, Flags: testpkt.SYN,
			Options: testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false)}}.Bytes()
	}
	for range 2 {
		if ret, out := runOut(t, egress, join(40001)); ret != tcxNext || string(out) != string(join(40001)) {
			t.Fatalf("the join within the maximum: verdict %d, changed %v; want it passed unchanged", int32(ret), string(out) != string(join(40001)))
		}
	}
	ret, rst := runOut(t, egress, join(40002))
	if ret != tcActRedirect {
		t.Fatalf("the join beyond the maximum: verdict %d, want TC_ACT_REDIRECT back into the pod", int32(ret))
	}
	d := tsharkDecode(t, [][]byte{rst}, []string{"ip.checksum.status", "tcp.checksum.status", "ip.src", "ip.dst", "tcp.srcport", "tcp.dstport",
		"tcp.flags.reset", "tcp.flags.ack", "tcp.ack_raw", "tcp.options.mptcp.subtype", "tcp.options.mptcp.rst_reason"})[0]
	want := map[string]string{"ip.checksum.status": tsharkGood, "tcp.checksum.status": tsharkGood, "ip.src": serverPod.String(), "ip.dst": clientPod.String(),
		"tcp.srcport": "5201", "tcp.dstport": "40002", "tcp.flags.reset": "1", "tcp.flags.ack": "1", "tcp.ack_raw": "1001",
		"tcp.options.mptcp.subtype": "8", "tcp.options.mptcp.rst_reason": "0x03"}
	for k, v := range want {
		if d[k] != v {
			t.Errorf("tshark: %s = %q, want %q", k, d[k], v)
		}
	}
	if n := stat(t, dp, StatJoinRefused); n != 1 {
		t.Errorf("StatJoinRefused = %d, want 1", n)
	}
	sfs, err := dp.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	for _, sf := range sfs {
		if sf.Local.Port() == 40002 {
			t.Errorf("the refused join was placed: %+v", sf)
		}
	}

	// Observe-only: the join is counted as observed and passes unchanged.
	if err := dp.SetObserveOnly(true); err != nil {
		t.Fatal(err)
	}
	if ret, out := runOut(t, egress, join(40003)); ret != tcxNext || string(out) != string(join(40003)) {
		t.Errorf("observe-only: verdict %d, changed %v; want the join passed unchanged", int32(ret), string(out) != string(join(40003)))
	}
}
