package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
)

// A new binary whose maps are laid out differently from the pinned ones
// migrates them while traffic runs (docs/agent.md, "Upgrade and map
// migration"):
//
//  1. prepareMigration, before the programs load: every pinned map whose
//     layout (kernelLayout, with the BTF the map was created with) differs
//     from the new spec's gets a new, unpinned map, filled by converting
//     each entry field by field (convertValue).
//  2. The programs load against the new maps (MapReplacements); the
//     unchanged maps are the pinned ones, shared.
//  3. switchLinks moves every pinned link to the new program with
//     link.Update: one atomic swap per hook and interface.
//  4. catchUp carries what the old programs wrote between the copy and the
//     switch: counter deltas of per-CPU maps, entries added to hash maps.
//  5. After the agent's first successful reconcile, CommitMigration renames
//     the new maps over the old pins and records the layout marker;
//     RollbackMigration instead puts the old programs back on the links,
//     removes links the new programs got, and leaves the old pins alone.

// layoutMarkerPin is a one-entry array pinned beside the maps, holding the
// hex digest of the layout (layoutHash) the pinned maps have: a restart of
// the same binary compares one value instead of every map's BTF.
const layoutMarkerPin = "layout_hash"

// stagingSubdir holds a migrated map between its pin and the rename over
// the old pin (bpffs names cannot contain dots, so no "name.new").
const stagingSubdir = "migrating"

const markerValueSize = 64

type migratedMap struct {
	name                 string
	old, new             *ebpf.Map
	oldLayout, newLayout mapLayout
	// base holds, for per-CPU maps, each entry as copied (new layout, by
	// new key): catchUp adds what the counters moved since.
	base             map[string][][]byte
	copied, dropped  int
	caughtUp, deltas int
	// table: the new map is a table (migrate_table.go), filled through
	// table_ctl after the programs load, from tableEntries.
	table        bool
	tableEntries []rawEntry
	// renumber: the old map numbers paths from 0 (migrate_paths.go).
	renumber bool
}

type switchedLink struct {
	pin     string
	oldProg *ebpf.Program
}

type migration struct {
	// renumber: the pinned maps number paths from 0 (migrate_paths.go).
	renumber bool
	hash     string
	pinDir   string
	maps     []*migratedMap
	switched []switchedLink
	// linksBefore are the link pins that existed before the new programs
	// loaded: a rollback removes the others.
	linksBefore map[string]bool
}

func (m *migration) replacements() map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	for _, mm := range m.maps {
		out[mm.name] = mm.new
	}
	return out
}

// Migrated names the maps a pending migration converts.
func (m *migration) names() []string {
	var out []string
	for _, mm := range m.maps {
		out = append(out, mm.name)
	}
	return out
}

func (m *migration) closeMaps() {
	for _, mm := range m.maps {
		_ = mm.old.Close()
		_ = mm.new.Close()
	}
	for _, s := range m.switched {
		_ = s.oldProg.Close()
	}
}

// LayoutHash is the layout digest of this binary's pinned maps.
func LayoutHash() (string, error) {
	spec, err := loadDatapath()
	if err != nil {
		return "", err
	}
	return layoutHash(spec), nil
}

// LayoutMarker reads the layout digest recorded under pinDir; "" when none
// is (a fresh node, or maps pinned by a release before markers).
func LayoutMarker(pinDir string) (string, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, layoutMarkerPin), nil)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer m.Close()
	var v [markerValueSize]byte
	if err := m.Lookup(uint32(0), &v); err != nil {
		return "", err
	}
	n := slices.Index(v[:], 0)
	if n < 0 {
		n = len(v)
	}
	return string(v[:n]), nil
}

func writeLayoutMarker(pinDir, hash string) error {
	m, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{
		Name: layoutMarkerPin, Type: ebpf.Array, KeySize: 4, ValueSize: markerValueSize, MaxEntries: 1, Pinning: ebpf.PinByName,
	}, ebpf.MapOptions{PinPath: pinDir})
	if err != nil {
		return fmt.Errorf("layout marker: %w", err)
	}
	defer m.Close()
	var v [markerValueSize]byte
	copy(v[:], hash)
	return m.Put(uint32(0), v)
}

// prepareMigration compares the pinned maps with spec and converts those
// that differ. It returns nil when nothing is pinned yet.
func prepareMigration(spec *ebpf.CollectionSpec, pinDir string, log *slog.Logger) (*migration, error) {
	mig := &migration{hash: layoutHash(spec), pinDir: pinDir, linksBefore: map[string]bool{}}
	marker, err := LayoutMarker(pinDir)
	if err != nil {
		return nil, err
	}
	if marker == mig.hash {
		log.Info("pinned map layout unchanged", "layout", mig.hash)
		return mig, nil
	}
	for _, h := range Hooks {
		entries, _ := os.ReadDir(filepath.Join(pinDir, linkPinSubdir, string(h)))
		for _, e := range entries {
			mig.linksBefore[filepath.Join(pinDir, linkPinSubdir, string(h), e.Name())] = true
		}
	}
	if sub, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, "subflows"), nil); err == nil {
		if l, err := kernelLayout(sub); err == nil {
			mig.renumber = pathsNumberedFromZero(l.Value)
		}
		_ = sub.Close()
	}
	if mig.renumber {
		log.Info("pinned maps number paths from 0: every path index is renumbered from 1, as the API numbers paths")
	}
	for _, name := range pinnedMapNames(spec) {
		if err := mig.prepareMap(spec, name, log); err != nil {
			mig.closeMaps()
			return nil, err
		}
	}
	if len(mig.maps) == 0 {
		log.Info("pinned map layout unchanged", "layout", mig.hash, "previousMarker", marker)
	}
	return mig, nil
}

// prepareMap converts the pinned map name where its layout differs from
// spec's, adding it to mig's maps; on error the caller closes them.
func (mig *migration) prepareMap(spec *ebpf.CollectionSpec, name string, log *slog.Logger) error {
	old, err := ebpf.LoadPinnedMap(filepath.Join(mig.pinDir, name), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil // new map: the load creates and pins it
	}
	if err != nil {
		return fmt.Errorf("pinned map %s: %w", name, err)
	}
	mm := &migratedMap{name: name, old: old, newLayout: specLayout(spec.Maps[name]), renumber: mig.renumber}
	if mm.oldLayout, err = kernelLayout(old); err != nil {
		_ = old.Close()
		return fmt.Errorf("pinned map %s: %w", name, err)
	}
	renumbered := mig.renumber && renumberedMaps[name]
	if mm.oldLayout.String() == mm.newLayout.String() && !renumbered {
		_ = old.Close()
		return nil
	}
	if mm.oldLayout.Key == nil && mm.oldLayout.Value == nil && spec.Maps[name].Compatible(old) == nil {
		// Created without BTF: nothing to convert by; the sizes
		// match, so it is reused as releases before migration did.
		log.Warn("pinned map has no BTF; reused as it is", "map", name)
		_ = old.Close()
		return nil
	}
	ms := spec.Maps[name].Copy()
	ms.Pinning = ebpf.PinNone
	if mm.new, err = ebpf.NewMap(ms); err != nil {
		_ = old.Close()
		return fmt.Errorf("creating map %s for migration: %w", name, err)
	}
	mig.maps = append(mig.maps, mm)
	if _, mm.table, err = tableShapeOf(mm.newLayout.Value); err != nil {
		return fmt.Errorf("map %s: %w", name, err)
	}
	if mm.table {
		// Converted now, so a field that cannot be carried fails
		// the load before anything changed; stored once the
		// programs load (Datapath.fillTables).
		if mm.tableEntries, err = mm.readForTable(); err != nil {
			return fmt.Errorf("migrating map %s (%s -> %s): %w", name, mm.oldLayout, mm.newLayout, err)
		}
		log.Info("map to be migrated into a table", "map", name, "entries", len(mm.tableEntries),
			"from", mm.oldLayout.String(), "to", mm.newLayout.String())
		return nil
	}
	if err := mm.copyEntries(); err != nil {
		return fmt.Errorf("migrating map %s (%s -> %s): %w", name, mm.oldLayout, mm.newLayout, err)
	}
	log.Info("map migrated to a new layout", "map", name, "entries", mm.copied, "dropped", mm.dropped,
		"from", mm.oldLayout.String(), "to", mm.newLayout.String())
	return nil
}

func perCPU(t ebpf.MapType) bool {
	return t == ebpf.PerCPUHash || t == ebpf.PerCPUArray || t == ebpf.LRUCPUHash
}

func isArray(t ebpf.MapType) bool { return t == ebpf.Array || t == ebpf.PerCPUArray }

// convertKey returns the new key of an old one, or nil when the new map has
// no room for it (an array index beyond its new size).
func (mm *migratedMap) convertKey(k []byte) ([]byte, error) {
	nk := make([]byte, mm.newLayout.KeySize)
	if err := convertValue(nk, mm.newLayout.Key, k, mm.oldLayout.Key); err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	if mm.renumber {
		if pathIndexedMaps[mm.name] {
			addOne(nk)
		} else {
			renumberPaths(nk, mm.newLayout.Key)
		}
	}
	if isArray(mm.newLayout.Type) && nativeEndian.Uint32(nk) >= mm.newLayout.MaxEntries {
		return nil, nil
	}
	return nk, nil
}

func (mm *migratedMap) convertOne(v []byte) ([]byte, error) {
	nv := make([]byte, mm.newLayout.ValueSize)
	if err := convertValue(nv, mm.newLayout.Value, v, mm.oldLayout.Value); err != nil {
		return nil, err
	}
	if mm.renumber {
		renumberPaths(nv, mm.newLayout.Value)
	}
	return nv, nil
}

func (mm *migratedMap) convertPerCPU(vs [][]byte) ([][]byte, error) {
	out := make([][]byte, len(vs))
	for i, v := range vs {
		var err error
		if out[i], err = mm.convertOne(v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (mm *migratedMap) copyEntries() error {
	if perCPU(mm.oldLayout.Type) != perCPU(mm.newLayout.Type) {
		return errors.New("a map cannot move between per-CPU and shared values")
	}
	if perCPU(mm.newLayout.Type) {
		mm.base = map[string][][]byte{}
	}
	var k []byte
	var v []byte
	var vs [][]byte
	it := mm.old.Iterate()
	for {
		var ok bool
		if mm.base != nil {
			ok = it.Next(&k, &vs)
		} else {
			ok = it.Next(&k, &v)
		}
		if !ok {
			break
		}
		nk, err := mm.convertKey(k)
		if err != nil {
			return err
		}
		if nk == nil {
			mm.dropped++
			continue
		}
		if mm.base != nil {
			nvs, err := mm.convertPerCPU(vs)
			if err != nil {
				return err
			}
			if err := mm.new.Put(nk, nvs); err != nil {
				return fmt.Errorf("writing entry: %w", err)
			}
			mm.base[string(nk)] = nvs
		} else {
			nv, err := mm.convertOne(v)
			if err != nil {
				return err
			}
			if err := mm.new.Put(nk, nv); err != nil {
				return fmt.Errorf("writing entry: %w", err)
			}
		}
		mm.copied++
	}
	return it.Err()
}

// PinnedSubflows reads the subflow table pinned under pinDir by whichever
// release pinned it, converted to this release's layout as a migration would
// convert it, and without touching the pins. It lets tests and tools inspect
// a node across an upgrade, when this binary's programs could not be loaded
// against the pinned maps.
func PinnedSubflows(pinDir string) ([]Subflow, error) {
	spec, err := loadDatapath()
	if err != nil {
		return nil, err
	}
	const name = "subflows"
	old, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), nil)
	if err != nil {
		return nil, err
	}
	defer old.Close()
	mm := &migratedMap{name: name, old: old, newLayout: specLayout(spec.Maps[name])}
	if mm.oldLayout, err = kernelLayout(old); err != nil {
		return nil, fmt.Errorf("pinned map %s: %w", name, err)
	}
	if mm.oldLayout.String() == mm.newLayout.String() {
		return subflowsIn(old)
	}
	entries, err := mm.readForTable()
	if err != nil {
		return nil, fmt.Errorf("converting map %s (%s -> %s): %w", name, mm.oldLayout, mm.newLayout, err)
	}
	out := make([]Subflow, 0, len(entries))
	for _, e := range entries {
		var k datapathFlowKey
		var v datapathSubflow
		if _, err := binary.Decode(e.key, nativeEndian, &k); err != nil {
			return nil, err
		}
		if _, err := binary.Decode(e.value, nativeEndian, &v); err != nil {
			return nil, err
		}
		out = append(out, subflowOf(k, v))
	}
	return out, nil
}
