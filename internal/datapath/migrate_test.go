package datapath

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
	"github.com/mptcp-operator/mptcp-operator/test/testutil/bpfutil"
)

var (
	btfU8  = &btf.Int{Name: "__u8", Size: 1}
	btfU16 = &btf.Int{Name: "__u16", Size: 2}
	btfU32 = &btf.Int{Name: "__u32", Size: 4}
	btfU64 = &btf.Int{Name: "__u64", Size: 8}
	btfS32 = &btf.Int{Name: "__s32", Size: 4, Encoding: btf.Signed}
	btfS64 = &btf.Int{Name: "__s64", Size: 8, Encoding: btf.Signed}
)

func member(name string, t btf.Type, byteOff uint32) btf.Member {
	return btf.Member{Name: name, Type: t, Offset: btf.Bits(byteOff * 8)}
}

// Two layouts of one value, as two releases would declare them: fields
// reordered, one widened (path), one narrowed that still fits (role), a
// signed one widened (delta), a pad gone, a rule added, a nested struct
// gaining and reordering fields inside a growing array.
var (
	oldInner = &btf.Struct{Name: "hop", Size: 8, Members: []btf.Member{member("a", btfU32, 0), member("b", btfU32, 4)}}
	oldValue = &btf.Struct{Name: "record", Size: 40, Members: []btf.Member{
		member("path", btfU16, 0), member("pad0", btfU16, 2), member("role", btfU32, 4), member("token", btfU32, 8),
		member("delta", btfS32, 12), member("created_ns", btfU64, 16), member("hops", &btf.Array{Type: oldInner, Index: btfU32, Nelems: 2}, 24),
	}}
	newInner = &btf.Struct{Name: "hop", Size: 16, Members: []btf.Member{member("b", btfU64, 0), member("a", btfU32, 8), member("c", btfU32, 12)}}
	newValue = &btf.Struct{Name: "record", Size: 96, Members: []btf.Member{
		member("created_ns", btfU64, 0), member("token", btfU32, 8), member("path", btfU32, 12), member("role", btfU8, 16),
		member("flags", btfU8, 17), member("rule", btfU32, 20), member("delta", btfS64, 24),
		member("hops", &btf.Array{Type: newInner, Index: btfU32, Nelems: 4}, 32),
	}}
	// The key gains a field too.
	oldKey = &btf.Struct{Name: "k", Size: 4, Members: []btf.Member{member("id", btfU32, 0)}}
	newKey = &btf.Struct{Name: "k", Size: 8, Members: []btf.Member{member("id", btfU32, 0), member("zone", btfU32, 4)}}
)

func le32(b []byte, off int, v uint32) { binary.LittleEndian.PutUint32(b[off:], v) }
func le64(b []byte, off int, v uint64) { binary.LittleEndian.PutUint64(b[off:], v) }

func oldEntry(id uint32) []byte {
	v := make([]byte, 40)
	binary.LittleEndian.PutUint16(v[0:], uint16(id%15))
	binary.LittleEndian.PutUint16(v[2:], 0xdead) // pad0: dropped
	le32(v, 4, 2)
	le32(v, 8, 0xabcd0000+id)
	le32(v, 12, 0xfffffffb) // -5
	le64(v, 16, 1_000_000+uint64(id))
	le32(v, 24, 7)
	le32(v, 28, 8)
	le32(v, 32, 9)
	le32(v, 36, 10)
	return v
}

func TestConvertValueMatchesFieldsByName(t *testing.T) {
	dst := make([]byte, 96)
	if err := convertValue(dst, newValue, oldEntry(3), oldValue); err != nil {
		t.Fatal(err)
	}
	checkNewEntry(t, 3, dst)
}

func checkNewEntry(t *testing.T, id uint32, v []byte) {
	t.Helper()
	u32 := func(off int) uint32 { return binary.LittleEndian.Uint32(v[off:]) }
	u64 := func(off int) uint64 { return binary.LittleEndian.Uint64(v[off:]) }
	checks := []struct {
		field     string
		got, want uint64
	}{
		{"created_ns", u64(0), 1_000_000 + uint64(id)},
		{"token", uint64(u32(8)), uint64(0xabcd0000 + id)},
		{"path (widened)", uint64(u32(12)), uint64(id % 15)},
		{"role (narrowed)", uint64(v[16]), 2},
		{"flags (new)", uint64(v[17]), 0},
		{"rule (new)", uint64(u32(20)), 0},
		{"delta (signed, widened)", u64(24), ^uint64(4)}, // -5
		{"hops[0].b", u64(32), 8},
		{"hops[0].a", uint64(u32(40)), 7},
		{"hops[0].c (new)", uint64(u32(44)), 0},
		{"hops[1].b", u64(48), 10},
		{"hops[1].a", uint64(u32(56)), 9},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("entry %d: %s = %#x, want %#x", id, c.field, c.got, c.want)
		}
	}
	for i := 64; i < 96; i++ {
		if v[i] != 0 {
			t.Fatalf("entry %d: new array elements hops[2..3] are not zero: % x", id, v[64:])
		}
	}
}

// An endpoint pinned before selector chains held one rule: it becomes a
// chain of that one rule, so that the agent can adopt the rule's id (a
// chain of none would make it look retired, and its live connections
// forgotten).
func TestAnEndpointsOneRuleBecomesAChainOfOne(t *testing.T) {
	old := &btf.Struct{Name: "endpoint", Size: 8, Members: []btf.Member{member("rule", btfU32, 0), member("flags", btfU32, 4)}}
	now := &btf.Struct{Name: "endpoint", Size: 44, Members: []btf.Member{member("nrules", btfU32, 0), member("flags", btfU32, 4),
		member("rules", &btf.Array{Type: btfU32, Index: btfU32, Nelems: 8}, 8), member("pod_slot", btfU32, 40)}}
	src := make([]byte, 8)
	le32(src, 0, 3)
	le32(src, 4, 0x5)
	dst := make([]byte, 44)
	if err := convertValue(dst, now, src, old); err != nil {
		t.Fatal(err)
	}
	u32 := func(off int) uint32 { return binary.LittleEndian.Uint32(dst[off:]) }
	if u32(0) != 1 || u32(4) != 0x5 || u32(8) != 3 || u32(12) != 0 || u32(40) != 0 {
		t.Errorf("endpoint % x: want nrules 1, flags 5, rules [3 0 ...], pod_slot 0", dst)
	}
}

func TestConvertValueRefusesWhatItCannotCarry(t *testing.T) {
	narrow := &btf.Struct{Size: 1, Members: []btf.Member{member("role", btfU8, 0)}}
	src := make([]byte, 40)
	le32(src, 4, 300)
	if err := convertValue(make([]byte, 1), narrow, src, oldValue); err == nil {
		t.Error("role 300 narrowed to a byte without an error")
	}
	kind := &btf.Struct{Size: 4, Members: []btf.Member{member("hops", btfU32, 0)}}
	if err := convertValue(make([]byte, 4), kind, src, oldValue); err == nil {
		t.Error("an array turned into an integer without an error")
	}
}

// migrationPinDir is a fresh directory on bpffs, removed with the test.
func migrationPinDir(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)
	dir := bpffsPinDir(t)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A pinned map made with the old BTF is migrated to the new layout: the
// comparison reads the old BTF back from the kernel, every entry is
// converted, and counters of a per-CPU map the old programs keep counting
// after the copy are caught up by their growth.
func TestMigrationConvertsPinnedMapsByTheirKernelBTF(t *testing.T) {
	dir := migrationPinDir(t)
	oldSpec := &ebpf.MapSpec{Name: "subflows", Type: ebpf.Hash, KeySize: 4, ValueSize: 40, MaxEntries: 64, Key: oldKey, Value: oldValue, Pinning: ebpf.PinByName}
	oldCounters := &btf.Struct{Size: 16, Members: []btf.Member{member("packets", btfU64, 0), member("bytes", btfU64, 8)}}
	newCounters := &btf.Struct{Size: 24, Members: []btf.Member{member("bytes", btfU64, 0), member("drops", btfU64, 8), member("packets", btfU64, 16)}}
	oldCountSpec := &ebpf.MapSpec{Name: "path_counters", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16, MaxEntries: 4, Key: btfU32, Value: oldCounters, Pinning: ebpf.PinByName}
	old, err := ebpf.NewMapWithOptions(oldSpec, ebpf.MapOptions{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	oldCount, err := ebpf.NewMapWithOptions(oldCountSpec, ebpf.MapOptions{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer oldCount.Close()
	for id := uint32(1); id <= 20; id++ {
		if err := old.Put(id, oldEntry(id)); err != nil {
			t.Fatal(err)
		}
	}
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	counters := func(packets, bytes uint64) [][]byte {
		out := make([][]byte, ncpu)
		for i := range out {
			out[i] = make([]byte, 16)
			le64(out[i], 0, packets+uint64(i))
			le64(out[i], 8, bytes)
		}
		return out
	}
	if err := oldCount.Put(uint32(1), counters(100, 5000)); err != nil {
		t.Fatal(err)
	}

	newSpec := &ebpf.CollectionSpec{Maps: map[string]*ebpf.MapSpec{
		"subflows":      {Name: "subflows", Type: ebpf.Hash, KeySize: 8, ValueSize: 96, MaxEntries: 128, Key: newKey, Value: newValue, Pinning: ebpf.PinByName},
		"path_counters": {Name: "path_counters", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 24, MaxEntries: 4, Key: btfU32, Value: newCounters, Pinning: ebpf.PinByName},
		"unchanged":     {Name: "unchanged", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1, Key: btfU32, Value: btfU32, Pinning: ebpf.PinByName},
	}}
	mig, err := prepareMigration(newSpec, dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer mig.closeMaps()
	if got := mig.names(); len(got) != 2 || got[0] != "path_counters" || got[1] != "subflows" {
		t.Fatalf("migrated maps %v, want [path_counters subflows]", got)
	}
	sub, cnt := mig.maps[1], mig.maps[0]
	if sub.copied != 20 {
		t.Errorf("copied %d subflow entries, want 20", sub.copied)
	}
	for id := uint32(1); id <= 20; id++ {
		k := make([]byte, 8)
		le32(k, 0, id)
		var v []byte
		if err := sub.new.Lookup(k, &v); err != nil {
			t.Fatalf("entry %d missing after migration: %v", id, err)
		}
		checkNewEntry(t, id, v)
	}

	// Between the copy and the switch the old programs keep counting and
	// place one more subflow; the new ones have started counting too.
	if err := oldCount.Put(uint32(1), counters(130, 9000)); err != nil {
		t.Fatal(err)
	}
	if err := old.Put(uint32(21), oldEntry(21)); err != nil {
		t.Fatal(err)
	}
	var cur [][]byte
	if err := cnt.new.Lookup(uint32(1), &cur); err != nil {
		t.Fatal(err)
	}
	for i := range cur {
		le64(cur[i], 16, binary.LittleEndian.Uint64(cur[i][16:])+2) // packets counted by the new programs
	}
	if err := cnt.new.Put(uint32(1), cur); err != nil {
		t.Fatal(err)
	}
	for _, mm := range mig.maps {
		if err := mm.catchUp(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cnt.new.Lookup(uint32(1), &cur); err != nil {
		t.Fatal(err)
	}
	for i, v := range cur {
		packets, bytes, drops := binary.LittleEndian.Uint64(v[16:]), binary.LittleEndian.Uint64(v[0:]), binary.LittleEndian.Uint64(v[8:])
		if want := uint64(130 + i + 2); packets != want || bytes != 9000 || drops != 0 {
			t.Errorf("cpu %d: packets %d bytes %d drops %d after catch-up, want %d, 9000, 0", i, packets, bytes, drops, want)
		}
	}
	k := make([]byte, 8)
	le32(k, 0, 21)
	var v []byte
	if err := sub.new.Lookup(k, &v); err != nil {
		t.Fatalf("subflow placed between copy and switch was not caught up: %v", err)
	}
	checkNewEntry(t, 21, v)
}

// loadOldRelease sets dir up as the previous release left a node: its
// subflow table, an LRU hash of struct subflow by flow_key whose struct had
// a pad where the rule is now, pinned with one entry; the other maps
// pinned; pod-egress attached to veth-a through a pinned link. This binary's
// programs stand in for the old ones on the link (their own subflow table,
// unpinned, is not the one at the pin).
func loadOldRelease(t *testing.T, dir string) (oldMapID ebpf.MapID, oldProgID ebpf.ProgramID) {
	t.Helper()
	return loadOldLayout(t, dir, func(m *btf.Member) {
		if m.Name == "rule" {
			m.Name = "pad"
		}
	})
}

// oldSubflowTable is the previous release's subflow table, pinned under
// dir, with struct subflow's members changed by edit (sizes must stay).
func oldSubflowTable(t *testing.T, dir string, edit func(*btf.Member)) *ebpf.Map {
	t.Helper()
	spec, err := loadDatapath()
	if err != nil {
		t.Fatal(err)
	}
	var key, value *btf.Struct
	if err := spec.Types.TypeByName("flow_key", &key); err != nil {
		t.Fatal(err)
	}
	if err := spec.Types.TypeByName("subflow", &value); err != nil {
		t.Fatal(err)
	}
	oldValue := *value
	oldValue.Members = append([]btf.Member(nil), value.Members...)
	for i := range oldValue.Members {
		edit(&oldValue.Members[i])
	}
	old, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: "subflows", Type: ebpf.LRUHash, KeySize: key.Size, ValueSize: value.Size,
		MaxEntries: 65536, Key: key, Value: &oldValue, Pinning: ebpf.PinByName}, ebpf.MapOptions{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { old.Close() })
	return old
}

// oldSubflowKey is the 4-tuple of the entry loadOldLayout leaves.
func oldSubflowKey(sport uint16) datapathFlowKey {
	return flowKey(netip.AddrPortFrom(clientPod, sport), netip.AddrPortFrom(serverPod, 5201))
}

// loadOldLayout is loadOldRelease with struct subflow's members changed by
// edit.
func loadOldLayout(t *testing.T, dir string, edit func(*btf.Member)) (oldMapID ebpf.MapID, oldProgID ebpf.ProgramID) {
	t.Helper()
	old := oldSubflowTable(t, dir, edit)
	spec, err := loadDatapath()
	if err != nil {
		t.Fatal(err)
	}
	spec.Maps["subflows"].Pinning = ebpf.PinNone
	_ = spec.Variables["mark_mask"].Set(DefaultMarkMask)
	_ = spec.Variables["mark_shift"].Set(uint32(20))
	dp := &Datapath{pinDir: dir, markMask: DefaultMarkMask, markShift: 20, mapNames: pinnedMapNames(spec)}
	if err := spec.LoadAndAssign(&dp.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}); err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if err := dp.Attach(Attachment{Interface: "veth-a", Hook: HookPodEgress}); err != nil {
		t.Fatal(err)
	}
	k := oldSubflowKey(40000)
	if err := old.Put(&k, &datapathSubflow{PathIndex: 1, Role: 1, Token: 0x1234, CreatedNs: 42}); err != nil {
		t.Fatal(err)
	}
	info, err := old.Info()
	if err != nil {
		t.Fatal(err)
	}
	oldMapID, _ = info.ID()
	pi, err := dp.objs.PodEgress.Info()
	if err != nil {
		t.Fatal(err)
	}
	oldProgID, _ = pi.ID()
	return oldMapID, oldProgID
}

func linkProgram(t *testing.T, pin string) ebpf.ProgramID {
	t.Helper()
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info.Program
}

// An upgrade over a node the previous release set up: the load migrates
// the subflow table (the marker is absent, the BTF differs), moves the
// pinned link to the new program at once and keeps the old pin until the
// commit. A rollback puts the old program back and leaves the old pin and
// its entry as they were; a second load then commits: the pin is the new
// map, with the entry, and the marker records the layout.
func TestMigrationRollsBackThenCommits(t *testing.T) {
	ns := throwawayNetns(t)
	dir := migrationPinDir(t)
	linkPin := filepath.Join(dir, linkPinSubdir, string(HookPodEgress), "veth-a")
	err := netnsutil.Do(ns, func() error {
		oldMap, oldProg := loadOldRelease(t, dir)
		// A map of the previous release this one does not have (as
		// pod_counters, the per-address pod counters pod_records
		// replaced): kept through the rollback, unpinned at the commit.
		gone := filepath.Join(dir, "pod_counters")
		podCounters, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: "pod_counters", Type: ebpf.PerCPUHash, KeySize: 20, ValueSize: 32, MaxEntries: 4096,
			Pinning: ebpf.PinByName}, ebpf.MapOptions{PinPath: dir})
		if err != nil {
			t.Fatal(err)
		}
		_ = podCounters.Close()
		if m, err := LayoutMarker(dir); err != nil || m != "" {
			t.Fatalf("layout marker %q (%v) before any migration-aware load, want none", m, err)
		}
		// Readable in this release's layout without loading against it.
		if sfs, err := PinnedSubflows(dir); err != nil || len(sfs) != 1 || sfs[0].Path != 1 || sfs[0].Token != 0x1234 {
			t.Errorf("PinnedSubflows of the previous release's table: %v (%v), want the one entry on path 1", sfs, err)
		}

		dp, err := Load(Options{PinDir: dir, Migrate: true})
		if err != nil {
			return err
		}
		if got := dp.MigratedMaps(); len(got) != 1 || got[0] != "subflows" {
			t.Fatalf("migrated %v, want [subflows]", got)
		}
		newProgInfo, _ := dp.objs.PodEgress.Info()
		newProg, _ := newProgInfo.ID()
		if p := linkProgram(t, linkPin); p != newProg {
			t.Errorf("pinned link runs program %d after the load, want the new one %d", p, newProg)
		}
		if id := bpfutil.PinnedMapID(t, filepath.Join(dir, "subflows")); id != oldMap {
			t.Errorf("subflows pin replaced before the commit: map %d, want the old %d", id, oldMap)
		}
		sfs, err := dp.Subflows()
		if err != nil || len(sfs) != 1 || sfs[0].Path != 1 || sfs[0].Token != 0x1234 {
			t.Errorf("new subflow table %v (%v), want the one entry on path 1", sfs, err)
		}
		// The new programs find it where table_ctl stored it.
		frame := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Flags: testpkt.ACK}}.Bytes()
		if mark := run(t, dp.objs.PodEgress, frame, skbContext{}); mark&dp.markMask == 0 || dp.pathOfMark(t, mark) != 1 {
			t.Errorf("a packet of the migrated subflow got mark %#x, want path 1", mark)
		}
		if err := dp.RollbackMigration(); err != nil {
			return err
		}
		_ = dp.Close()
		if p := linkProgram(t, linkPin); p != oldProg {
			t.Errorf("pinned link runs program %d after the rollback, want the old one %d", p, oldProg)
		}
		if id := bpfutil.PinnedMapID(t, filepath.Join(dir, "subflows")); id != oldMap {
			t.Errorf("subflows pin is map %d after the rollback, want the old %d", id, oldMap)
		}
		if m, _ := LayoutMarker(dir); m != "" {
			t.Errorf("rollback wrote the layout marker %q", m)
		}
		if _, err := os.Stat(gone); err != nil {
			t.Errorf("the previous release's pod_counters pin after the rollback: %v, want it kept", err)
		}

		dp, err = Load(Options{PinDir: dir, Migrate: true})
		if err != nil {
			return err
		}
		defer dp.Close()
		if !dp.MigrationPending() {
			t.Fatal("second load after the rollback migrated nothing")
		}
		if err := dp.CommitMigration(); err != nil {
			return err
		}
		if id := bpfutil.PinnedMapID(t, filepath.Join(dir, "subflows")); id == oldMap {
			t.Error("subflows pin still the old map after the commit")
		}
		want, _ := LayoutHash()
		if m, _ := LayoutMarker(dir); m != want {
			t.Errorf("layout marker %q after the commit, want %q", m, want)
		}
		if _, err := os.Stat(filepath.Join(dir, stagingSubdir)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("staging directory left behind: %v", err)
		}
		if _, err := os.Stat(gone); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the previous release's pod_counters pin after the commit: %v, want it removed", err)
		}
		// The next start sees the marker and migrates nothing.
		dp2, err := Load(Options{PinDir: dir, Migrate: true})
		if err != nil {
			return err
		}
		defer dp2.Close()
		if dp2.MigrationPending() {
			t.Errorf("a restart of the same binary migrated %v again", dp2.MigratedMaps())
		}
		sfs, err = dp2.Subflows()
		if err != nil || len(sfs) != 1 || sfs[0].Path != 1 || sfs[0].Role != RoleInitiator || sfs[0].Token != 0x1234 {
			t.Errorf("pinned subflow table after the commit %v (%v), want the one entry on path 1", sfs, err)
		}
		return dp2.Unpin()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A subflow the old programs place between the copy and the switch is
// carried into the new table by the catch-up, and one the new programs
// stored in the meantime is kept as they stored it.
func TestMigrationIntoTheTableCatchesUpWhatTheOldProgramsAdded(t *testing.T) {
	ns := throwawayNetns(t)
	dir := migrationPinDir(t)
	err := netnsutil.Do(ns, func() error {
		loadOldRelease(t, dir)
		old, err := ebpf.LoadPinnedMap(filepath.Join(dir, "subflows"), nil)
		if err != nil {
			return err
		}
		defer old.Close()
		dp, err := Load(Options{PinDir: dir, Migrate: true})
		if err != nil {
			return err
		}
		defer dp.Close()
		late, mine := oldSubflowKey(40001), oldSubflowKey(40002)
		if err := old.Put(&late, &datapathSubflow{PathIndex: 2, Role: 2, Token: 0x77}); err != nil {
			return err
		}
		if err := old.Put(&mine, &datapathSubflow{PathIndex: 3, Role: 1}); err != nil {
			return err
		}
		putSubflow(t, dp, mine, datapathSubflow{PathIndex: 4, Role: 1})
		if err := dp.catchUp(); err != nil {
			return err
		}
		if got := lookupSubflow(t, dp, late); got.PathIndex != 2 || got.Role != 2 || got.Token != 0x77 {
			t.Errorf("subflow added after the copy: %+v, want path 2, responder, token 0x77", got)
		}
		if got := lookupSubflow(t, dp, mine); got.PathIndex != 4 {
			t.Errorf("subflow the new programs stored: path %d after the catch-up, want their 4", got.PathIndex)
		}
		if sfs, err := dp.Subflows(); err != nil || len(sfs) != 3 {
			t.Errorf("%d subflows after the catch-up (%v), want 3", len(sfs), err)
		}
		return dp.RollbackMigration()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The previous release's police buckets, an LRU hash keyed by a 28-byte
// struct rate_key, move into the police table with their keys widened (the
// new pad2 zero) and their theoretical arrival times kept.
func TestMigrationMovesPoliceBucketsIntoTheTable(t *testing.T) {
	dir := migrationPinDir(t)
	spec, err := loadDatapath()
	if err != nil {
		t.Fatal(err)
	}
	var key *btf.Struct
	if err := spec.Types.TypeByName("rate_key", &key); err != nil {
		t.Fatal(err)
	}
	oldKey := *key
	oldKey.Size = 28
	oldKey.Members = slices.DeleteFunc(slices.Clone(key.Members), func(m btf.Member) bool { return m.Name == "pad2" })
	var bucket *btf.Struct
	if err := spec.Types.TypeByName("rate_bucket", &bucket); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: "rate_buckets", Type: ebpf.LRUHash, KeySize: 28, ValueSize: 8, MaxEntries: 32768,
		Key: &oldKey, Value: bucket, Pinning: ebpf.PinByName}, ebpf.MapOptions{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	want := map[datapathRateKey]uint64{}
	for i := range uint32(50) {
		k := datapathRateKey{Id: 0xabc00 + i, Rule: 3, Family: 2, Kind: rateKindConn, Dir: 1}
		copy(k.Addr[:], clientPod.AsSlice())
		raw := rawBytes(k)[:28]
		if err := old.Put(raw, uint64(1000+i)); err != nil {
			t.Fatal(err)
		}
		want[k] = uint64(1000 + i)
	}
	dp, err := Load(Options{PinDir: dir, Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if got := dp.MigratedMaps(); !slices.Contains(got, "rate_buckets") {
		t.Fatalf("migrated %v, want rate_buckets among them", got)
	}
	got := map[datapathRateKey]uint64{}
	if err := readTable(dp.objs.RateBuckets, policeWays, func(e *datapathPoliceEntry) { got[e.Key] = e.Value.TatNs }); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Errorf("police table after migration: %d buckets, want the %d carried over with their times", len(got), len(want))
	}
	if err := dp.RollbackMigration(); err != nil {
		t.Fatal(err)
	}
}

// Maps pinned by this very binary before markers existed read back from
// the kernel with the layout the spec has: nothing is migrated, and the
// marker is written so the next start decides at once.
func TestSameLayoutWithoutMarkerMigratesNothing(t *testing.T) {
	dir := migrationPinDir(t)
	dp, err := Load(Options{PinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	_ = dp.Close()
	if m, _ := LayoutMarker(dir); m != "" {
		t.Fatalf("a load without Migrate wrote the marker %q", m)
	}
	dp, err = Load(Options{PinDir: dir, Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if dp.MigrationPending() {
		t.Errorf("maps of the same layout were migrated: %v", dp.MigratedMaps())
	}
	want, _ := LayoutHash()
	if m, _ := LayoutMarker(dir); m != want {
		t.Errorf("layout marker %q, want %q", m, want)
	}
	if err := dp.Unpin(); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("Unpin left %v", entries)
	}
}

// A pinned map that cannot be converted (a field changed kind) fails the
// load with the map and the field named, before anything changed: the
// link keeps the old program, the pin the old map, no marker is written.
func TestFailedConversionChangesNothing(t *testing.T) {
	ns := throwawayNetns(t)
	dir := migrationPinDir(t)
	linkPin := filepath.Join(dir, linkPinSubdir, string(HookPodEgress), "veth-a")
	err := netnsutil.Do(ns, func() error {
		oldMap, oldProg := loadOldLayout(t, dir, func(m *btf.Member) {
			if m.Name == "role" {
				m.Type = &btf.Array{Type: btfU8, Index: btfU32, Nelems: 4}
			}
		})
		dp, err := Load(Options{PinDir: dir, Migrate: true})
		if err == nil {
			_ = dp.Close()
			t.Fatal("a role that became an array was converted")
		}
		if !strings.Contains(err.Error(), "subflows") || !strings.Contains(err.Error(), ".role") {
			t.Errorf("error %q does not name the map and the field", err)
		}
		if p := linkProgram(t, linkPin); p != oldProg {
			t.Errorf("pinned link runs program %d after the failed load, want the old %d", p, oldProg)
		}
		if id := bpfutil.PinnedMapID(t, filepath.Join(dir, "subflows")); id != oldMap {
			t.Errorf("subflows pin is map %d after the failed load, want the old %d", id, oldMap)
		}
		if m, _ := LayoutMarker(dir); m != "" {
			t.Errorf("a failed load wrote the marker %q", m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// rate_rules was a hash keyed by rule id and is an array indexed by it: the
// migration carries each rule's caps to its index, and drops an id beyond
// the array (none could be set: rules are an array of the same size).
func TestMigrationMovesRateRulesFromAHashIntoAnArray(t *testing.T) {
	dir := migrationPinDir(t)
	spec, err := loadDatapath()
	if err != nil {
		t.Fatal(err)
	}
	cur := spec.Maps["rate_rules"]
	if cur.Type != ebpf.Array {
		t.Fatalf("rate_rules is a %v, this test expects the array", cur.Type)
	}
	oldSpec := cur.Copy()
	oldSpec.Type = ebpf.Hash
	oldSpec.MaxEntries = 512
	old, err := ebpf.NewMapWithOptions(oldSpec, ebpf.MapOptions{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	police := datapathRateCfg{Mode: uint32(RatePolice), Flags: uint32(Egress), ConnBps: 40_000_000, BurstBytes: 1_000_000}
	police.PathBps[2] = 7
	if err := old.Put(uint32(3), &police); err != nil {
		t.Fatal(err)
	}
	if err := old.Put(uint32(300), &police); err != nil {
		t.Fatal(err)
	}
	mig, err := prepareMigration(&ebpf.CollectionSpec{Maps: map[string]*ebpf.MapSpec{"rate_rules": cur}}, dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer mig.closeMaps()
	if got := mig.names(); len(got) != 1 || got[0] != "rate_rules" {
		t.Fatalf("migrated maps %v, want [rate_rules]", got)
	}
	var got datapathRateCfg
	if err := mig.maps[0].new.Lookup(uint32(3), &got); err != nil {
		t.Fatal(err)
	}
	if got != police {
		t.Errorf("rule 3 after migration %+v, want %+v", got, police)
	}
	var ids []uint32
	var k uint32
	var v datapathRateCfg
	for it := mig.maps[0].new.Iterate(); it.Next(&k, &v); {
		if v.Mode != uint32(datapathRateModeRATE_MODE_NONE) {
			ids = append(ids, k)
		}
	}
	if len(ids) != 1 || ids[0] != 3 {
		t.Errorf("rules with caps after migration %v, want [3]", ids)
	}
}

// A node pinned by a release that numbered paths from 0 (its struct subflow
// held a "path", the API's index minus one) is migrated to the API's
// numbering: every path index its maps hold moves up by one, so a live
// subflow, a connection's used paths, a rule, a NIC, a path's state, its
// counters and its police cap all stay with the path they were about.
func TestMigrationRenumbersPathsOfAZeroBasedNode(t *testing.T) {
	dir := migrationPinDir(t)
	old := oldSubflowTable(t, dir, func(m *btf.Member) {
		if m.Name == "path_index" {
			m.Name = "path"
		}
	})
	initial, join := oldSubflowKey(40000), oldSubflowKey(40001)
	if err := old.Put(&initial, &datapathSubflow{PathIndex: 0, Role: 1, Rule: 3}); err != nil {
		t.Fatal(err)
	}
	if err := old.Put(&join, &datapathSubflow{PathIndex: 1, Role: 1, Rule: 3}); err != nil {
		t.Fatal(err)
	}
	spec, err := loadDatapath()
	if err != nil {
		t.Fatal(err)
	}
	pinned := func(name string) *ebpf.Map {
		m, err := ebpf.NewMapWithOptions(spec.Maps[name], ebpf.MapOptions{PinPath: dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	put := func(m *ebpf.Map, k, v any) {
		t.Helper()
		if err := m.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	const nicIfindex = 7
	put(pinned("nics"), uint32(nicIfindex), &datapathNic{Path: 1})
	conn := datapathConnKey{Token: 0xabcd, Family: 2}
	copy(conn.Local[:], clientPod.AsSlice())
	put(pinned("conn_states"), &conn, &datapathConn{Used: 0b11, Rule: 3, Subflows: 1, Joins: 1})
	rule := datapathRule{Npaths: 2, Blocked: 1 << 2}
	rule.Paths[0], rule.Paths[1] = 0, 1
	put(pinned("rules"), uint32(3), &rule)
	ncpu := ebpf.MustPossibleCPU()
	counters := make([]datapathPathStats, ncpu)
	counters[0].TxBytes = 1000
	put(pinned("path_counters"), uint32(0), counters)
	put(pinned("path_states"), uint32(1), &datapathPathState{Flags: pathDown})
	police := datapathRateCfg{Mode: uint32(RatePolice), Flags: uint32(Egress), BurstBytes: 1 << 20}
	police.PathBps[1] = 50_000_000
	put(pinned("rate_rules"), uint32(3), &police)

	dp, err := Load(Options{PinDir: dir, Migrate: true, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if !dp.migration.renumber {
		t.Fatal("the zero-based node was not recognised")
	}
	sfs, err := dp.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	got := map[netip.AddrPort]uint32{}
	for _, sf := range sfs {
		got[sf.Local] = sf.Path
	}
	if got[netip.AddrPortFrom(clientPod, 40000)] != 1 || got[netip.AddrPortFrom(clientPod, 40001)] != 2 || len(got) != 2 {
		t.Errorf("subflows on paths %v, want the initial one on 1 and the join on 2", got)
	}
	var nic datapathNic
	if err := dp.objs.Nics.Lookup(uint32(nicIfindex), &nic); err != nil || nic.Path != 2 {
		t.Errorf("NIC on path %d (%v), want 2", nic.Path, err)
	}
	if conns, err := dp.Connections(); err != nil || len(conns) != 1 || conns[0].UsedPaths != 0b110 {
		t.Errorf("connections %+v (%v), want one using paths 1 and 2", conns, err)
	}
	var r datapathRule
	if err := dp.objs.Rules.Lookup(uint32(3), &r); err != nil || r.Paths[0] != 1 || r.Paths[1] != 2 || r.Blocked != 1<<3 {
		t.Errorf("rule 3: paths %v blocked %#x (%v), want paths 1, 2 and path 3 blocked", r.Paths[:2], r.Blocked, err)
	}
	ps, err := dp.PathStats()
	if err != nil || ps[1].TxBytes != 1000 || ps[0].TxBytes != 0 {
		t.Errorf("path counters %+v (%v), want path 1's bytes where path 0's were", ps[:3], err)
	}
	if down, err := dp.PathDown(2); err != nil || !down {
		t.Errorf("path 2 down = %v (%v), want the state old path 1 had", down, err)
	}
	if down, err := dp.PathDown(1); err != nil || down {
		t.Errorf("path 1 down = %v (%v), want up", down, err)
	}
	var rc datapathRateCfg
	if err := dp.objs.RateRules.Lookup(uint32(3), &rc); err != nil || rc.PathBps[2] != 50_000_000 || rc.PathBps[1] != 0 {
		t.Errorf("rate rule 3 path caps %v (%v), want old path 1's cap on path 2", rc.PathBps, err)
	}
	if err := dp.RollbackMigration(); err != nil {
		t.Fatal(err)
	}
}
