package datapath

import (
	"bytes"
	"encoding/binary"
	"maps"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// insertSubflow stores a subflow entry through table_ctl; replace says
// whether an existing entry of the key is rewritten or kept.
func insertSubflow(dp *Datapath, k datapathFlowKey, v datapathSubflow, replace bool) (tableResult, error) {
	op := datapathTableOpCodeTABLE_OP_INSERT_NEW
	if replace {
		op = datapathTableOpCodeTABLE_OP_INSERT
	}
	r, err := dp.tableOp(tableSubflows, op, rawBytes(k), rawBytes(v))
	return tableResult(r), err
}

// putSubflow stores a subflow entry through table_ctl, as user space may.
func putSubflow(t *testing.T, dp *Datapath, k datapathFlowKey, v datapathSubflow) {
	t.Helper()
	if r, err := insertSubflow(dp, k, v, true); err != nil || r == datapathTableResultTABLE_FAILED {
		t.Fatalf("storing a subflow: %v, %v", r, err)
	}
}

// lookupSubflow returns k's entry of the subflow table.
func lookupSubflow(t *testing.T, dp *Datapath, k datapathFlowKey) datapathSubflow {
	t.Helper()
	entries, err := subflowEntries(dp.objs.Subflows)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Key == k {
			return e.Value
		}
	}
	t.Fatalf("no subflow %+v in the table", k)
	return datapathSubflow{}
}

// bucketOf is the bucket the programs put k in: a Go copy of table_hash
// (bpf/include/table.h) with the seed the datapath was loaded with, so
// that a test can build keys that share a bucket.
func bucketOf(t *testing.T, dp *Datapath, k datapathFlowKey) uint32 {
	t.Helper()
	var seed datapathTableSeedValue
	if err := dp.objs.TableSeeds.Lookup(uint32(0), &seed); err != nil {
		t.Fatal(err)
	}
	raw := rawBytes(k)
	h := seed.Seed[0]
	for i := 0; i < len(raw)/8; i++ {
		h += binary.NativeEndian.Uint64(raw[8*i:]) * (seed.Seed[i+1] | 1)
	}
	return uint32(h >> (64 - (bits.Len32(dp.objs.Subflows.MaxEntries()) - 1))) // SUBFLOW_TABLE_BITS
}

// rawBucket reads bucket idx of the subflow table.
func rawBucket(t *testing.T, dp *Datapath, idx uint32) datapathSubflowBucket {
	t.Helper()
	var b datapathSubflowBucket
	if err := dp.objs.Subflows.Lookup(idx, &b); err != nil {
		t.Fatal(err)
	}
	return b
}

func keyOf(local, remote netip.AddrPort) datapathFlowKey { return flowKey(local, remote) }

// What a program stores, user space finds, and the reverse: the programs
// and table_ctl hash alike (one seed) and agree with the Go copy of the
// hash; a delete frees the entry for the programs too.
func TestTableProgramsAndUserSpaceSeeTheSameEntries(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1, 2, 3}}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		if placeSYN(t, dp, clientPod, uint16(20000+i), serverPod, 80) < 0 {
			t.Fatalf("SYN %d not placed", i)
		}
	}
	sfs, err := dp.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	if len(sfs) != n {
		t.Fatalf("%d subflows listed, want the %d placed", len(sfs), n)
	}
	for _, sf := range sfs {
		k := keyOf(sf.Local, sf.Remote)
		b := rawBucket(t, dp, bucketOf(t, dp, k))
		if !slices.ContainsFunc(b.E[:], func(e datapathSubflowEntry) bool { return e.Key == k }) {
			t.Fatalf("subflow %v -> %v is not in the bucket its hash names", sf.Local, sf.Remote)
		}
	}

	// Stored by user space: the program marks the subflow's packets with
	// the stored path.
	k := keyOf(netip.AddrPortFrom(clientPod, 30000), netip.AddrPortFrom(serverPod, 443))
	putSubflow(t, dp, k, datapathSubflow{PathIndex: 7, Role: uint32(RoleInitiator), Rule: 0})
	frame := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 30000, DstPort: 443, Flags: testpkt.ACK}}.Bytes()
	if mark := run(t, dp.objs.PodEgress, frame, skbContext{}); dp.pathOfMark(t, mark) != 7 {
		t.Fatalf("a packet of the subflow user space stored got mark %#x, want path 7", mark)
	}
	// Deleted by user space: the program no longer knows it.
	if err := dp.ForgetSubflow(netip.AddrPortFrom(clientPod, 30000), netip.AddrPortFrom(serverPod, 443)); err != nil {
		t.Fatal(err)
	}
	if mark := run(t, dp.objs.PodEgress, frame, skbContext{}); mark&dp.markMask != 0 {
		t.Fatalf("a packet of a forgotten subflow got mark %#x", mark)
	}
	if got := stat(t, dp, StatSubflowForgotten); got != 1 {
		t.Errorf("StatSubflowForgotten = %d, want 1", got)
	}
	// Forgetting what is not there changes nothing.
	if err := dp.ForgetSubflow(netip.AddrPortFrom(clientPod, 30000), netip.AddrPortFrom(serverPod, 443)); err != nil {
		t.Fatal(err)
	}
	if got := stat(t, dp, StatSubflowForgotten); got != 1 {
		t.Errorf("StatSubflowForgotten = %d after forgetting nothing, want 1", got)
	}
}

// The seed is kept with the pinned maps: a second load of the same pins
// hashes alike and finds every subflow the first placed; a load without
// pins gets a seed of its own.
func TestTableSeedIsKeptWithThePins(t *testing.T) {
	pin := bpffsPinDir(t)
	dp, err := Load(Options{PinDir: pin})
	if err != nil {
		t.Fatal(err)
	}
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1, 2}}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	paths := map[uint16]int{}
	for p := uint16(20000); p < 20050; p++ {
		paths[p] = placeSYN(t, dp, clientPod, p, serverPod, 80)
	}
	var first datapathTableSeedValue
	if err := dp.objs.TableSeeds.Lookup(uint32(0), &first); err != nil {
		t.Fatal(err)
	}
	dp.Close()

	dp2, err := Load(Options{PinDir: pin})
	if err != nil {
		t.Fatal(err)
	}
	defer dp2.Close()
	var second datapathTableSeedValue
	if err := dp2.objs.TableSeeds.Lookup(uint32(0), &second); err != nil {
		t.Fatal(err)
	}
	if second != first || first == (datapathTableSeedValue{}) {
		t.Fatalf("seed %x after reloading the pins, was %x", second.Seed, first.Seed)
	}
	for p, path := range paths {
		frame := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: p, DstPort: 80, Flags: testpkt.ACK}}.Bytes()
		if got := int(dp2.pathOfMark(t, run(t, dp2.objs.PodEgress, frame, skbContext{}))); got != path {
			t.Fatalf("port %d: path %d after reloading the pins, was placed on %d", p, got, path)
		}
	}

	dp3 := loadForTest(t)
	var third datapathTableSeedValue
	if err := dp3.objs.TableSeeds.Lookup(uint32(0), &third); err != nil {
		t.Fatal(err)
	}
	if third == first {
		t.Fatal("a load without pins reused another datapath's seed")
	}
}

// collidingRemotes returns n remote ends (address and port) whose subflows
// from clientPod's port 40000 share one bucket of dp's subflow table. A
// run of ports alone would not do: the hash of keys that differ in one word
// is an arithmetic progression, spread almost evenly over the buckets.
func collidingRemotes(t *testing.T, dp *Datapath, n int) []netip.AddrPort {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	local := netip.AddrPortFrom(clientPod, 40000)
	byBucket := map[uint32][]netip.AddrPort{}
	for range 1 << 20 {
		remote := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 99, byte(rng.IntN(256)), byte(rng.IntN(256))}), uint16(1+rng.IntN(65535)))
		b := bucketOf(t, dp, keyOf(local, remote))
		if slices.Contains(byBucket[b], remote) {
			continue
		}
		byBucket[b] = append(byBucket[b], remote)
		if len(byBucket[b]) == n {
			return byBucket[b]
		}
	}
	t.Fatalf("no %d subflows share a bucket", n)
	return nil
}

// A full bucket evicts, for a new subflow, a subflow no packet looked up
// since the bucket's last eviction; when every one was looked up, the
// oldest way by the bucket's hand. The evicted subflow's packets are no
// longer marked, every other one keeps its path, and the eviction is
// counted.
func TestTableEvictsWhatWasNotUsedSinceTheLastEviction(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1, 2, 3, 4}}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	remotes := collidingRemotes(t, dp, 6)
	place := func(r netip.AddrPort) { placeSYN(t, dp, clientPod, 40000, r.Addr(), r.Port()) }
	known := func(r netip.AddrPort) bool {
		frame := testpkt.Frame{Src: clientPod, Dst: r.Addr(), TCP: &testpkt.TCP{SrcPort: 40000, DstPort: r.Port(), Flags: testpkt.ACK}}.Bytes()
		return run(t, dp.objs.PodEgress, frame, skbContext{})&dp.markMask != 0
	}

	for _, r := range remotes[:4] {
		place(r)
	}
	if got := stat(t, dp, StatSubflowEvicted); got != 0 {
		t.Fatalf("%d evictions filling a bucket's four ways", got)
	}
	// All four were used (placed) since the bucket was made: the fifth
	// takes the hand's way, the first.
	place(remotes[4])
	if known(remotes[0]) {
		t.Fatalf("the subflow to %v, in the hand's way, survived the fifth subflow", remotes[0])
	}
	// Since that eviction, packets of the second and third were looked
	// up, the fifth was placed; the fourth was not: the sixth evicts it.
	if !known(remotes[1]) || !known(remotes[2]) {
		t.Fatal("subflows not evicted lost their entries")
	}
	place(remotes[5])
	for i, want := range []bool{false, true, true, false, true, true} {
		if got := known(remotes[i]); got != want {
			t.Errorf("the subflow to %v (placed %d of 6) known %v, want %v", remotes[i], i+1, got, want)
		}
	}
	if got := stat(t, dp, StatSubflowEvicted); got != 2 {
		t.Errorf("StatSubflowEvicted = %d, want 2", got)
	}
	tables, err := dp.Occupancy()
	if err != nil {
		t.Fatal(err)
	}
	if o := tables["subflows"]; o.Entries != 4 || o.Evictions != 2 {
		t.Errorf("occupancy %+v, want 4 entries and 2 evictions", o)
	}
}

// Filled beyond its capacity by placements on two CPUs at once while user
// space deletes, the table stays consistent: every entry created is live or
// counted evicted or deleted, no way is left busy, no key is live twice,
// every live key sits in the bucket its hash names, and the entries the
// programs counted per pod are the ones the table holds. The writers'
// subflows come from 24 pods, so that the table fills although each pod may
// hold only a sixteenth of it.
func TestTableStaysConsistentUnderConcurrentWriters(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1, 2}}})
	const writers, podsPerWriter = 3, 8
	var clients []netip.Addr
	for i := range writers * podsPerWriter {
		a := netip.AddrFrom4([4]byte{10, 244, 7, byte(i + 1)})
		clients = append(clients, a)
		if err := dp.SetEndpoint(a, 0); err != nil {
			t.Fatal(err)
		}
	}
	// The subflow from port p of writer w's pods: from each pod in turn.
	client := func(w, p int) netip.Addr { return clients[w*podsPerWriter+p%podsPerWriter] }
	var wg sync.WaitGroup
	errs := make(chan error, writers+1)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := 1; p < 1<<15; p++ {
				frame := syn(client(w, p), uint16(p), serverPod, 80, testpkt.MPCapableSYN())
				if _, err := dp.objs.PodEgress.Run(&ebpf.RunOptions{Data: frame}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var deleted uint64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for p := 1; p < 1<<15; p += 3 {
			n, err := dp.deleteTable(tableSubflows, keyOf(netip.AddrPortFrom(client(0, p), uint16(p)), netip.AddrPortFrom(serverPod, 80)))
			if err != nil {
				errs <- err
				return
			}
			deleted += uint64(n)
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	st, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	var live uint64
	seen := map[datapathFlowKey]bool{}
	keys := make([]uint32, tableReadChunk)
	buckets := make([]datapathSubflowBucket, tableReadChunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := dp.objs.Subflows.BatchLookup(&cursor, keys, buckets, nil)
		for i := range n {
			for w, tag := range buckets[i].Head.Tag {
				if tag == 1 { // TABLE_TAG_BUSY
					t.Fatalf("bucket %d way %d left busy", keys[i], w)
				}
				if tag&tableTagLive == 0 {
					continue
				}
				k := buckets[i].E[w].Key
				if seen[k] {
					t.Errorf("key %+v live twice", k)
				}
				seen[k] = true
				live++
				if b := bucketOf(t, dp, k); b != keys[i] {
					t.Errorf("key %+v in bucket %d, its hash names %d", k, keys[i], b)
				}
			}
		}
		if err != nil {
			break
		}
	}
	inserted, evicted, full := st[StatSubflowInsert], st[StatSubflowEvicted], st[StatPodSubflowsFull]
	if inserted+full != writers*(1<<15-1) || st[StatMapUpdateFailed] != 0 {
		t.Errorf("%d inserts, %d refused to full pods, %d failed; want one of the first two per SYN, none failed",
			inserted, full, st[StatMapUpdateFailed])
	}
	if evicted == 0 || live > uint64(tableCapacity(dp.objs.Subflows)) {
		t.Errorf("%d live of %d, %d evicted: %d SYNs should overfill the table", live, tableCapacity(dp.objs.Subflows), evicted, inserted)
	}
	if inserted != live+evicted+deleted {
		t.Errorf("inserted %d != live %d + evicted %d + deleted %d", inserted, live, evicted, deleted)
	}
	counted := podSlots(t, dp)
	if err := dp.RecountPodSubflows(); err != nil {
		t.Fatal(err)
	}
	if held := podSlots(t, dp); !maps.Equal(counted, held) {
		t.Errorf("the programs counted %v entries per pod slot, the table holds %v", counted, held)
	}
}

// table_ctl refuses what it does not know, and user space's raw entries
// have the words the program reads.
func TestTableCtlRefusesUnknownRequests(t *testing.T) {
	dp := loadForTest(t)
	k := keyOf(netip.AddrPortFrom(clientPod, 1), netip.AddrPortFrom(serverPod, 2))
	if _, err := dp.tableOp(tableSubflows, 99, rawBytes(k), nil); err == nil {
		t.Error("table_ctl accepted operation 99")
	}
	if _, err := dp.tableOp(7, datapathTableOpCodeTABLE_OP_INSERT, rawBytes(k), nil); err == nil {
		t.Error("table_ctl accepted table 7")
	}
	if _, err := dp.tableOp(tableSubflows, datapathTableOpCodeTABLE_OP_INSERT, make([]byte, 41), nil); err == nil {
		t.Error("a 41-byte key was accepted")
	}
	var words [5]uint64
	if err := putWords(words[:], rawBytes(k)); err != nil {
		t.Fatal(err)
	}
	if b := new(bytes.Buffer); binary.Write(b, binary.NativeEndian, words) != nil || !bytes.Equal(b.Bytes(), rawBytes(k)) {
		t.Errorf("key words %x do not hold the key's bytes %x", b.Bytes(), rawBytes(k))
	}
	if r, err := insertSubflow(dp, k, datapathSubflow{PathIndex: 1}, false); err != nil || r != datapathTableResultTABLE_INSERTED {
		t.Fatalf("insert: %v, %v", r, err)
	}
	if r, err := insertSubflow(dp, k, datapathSubflow{PathIndex: 2}, false); err != nil || r != datapathTableResultTABLE_EXISTS {
		t.Fatalf("insert of an existing key without replace: %v, %v", r, err)
	}
	if got := lookupSubflow(t, dp, k); got.PathIndex != 1 {
		t.Errorf("path %d after an insert without replace, want 1 kept", got.PathIndex)
	}
	if r, err := insertSubflow(dp, k, datapathSubflow{PathIndex: 2}, true); err != nil || r != datapathTableResultTABLE_REPLACED {
		t.Fatalf("insert with replace: %v, %v", r, err)
	}
	if got := lookupSubflow(t, dp, k); got.PathIndex != 2 {
		t.Errorf("path %d after replacing, want 2", got.PathIndex)
	}
}
