package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// Migrating into a table (bpf/include/table.h). A table's entries live in
// buckets whose place depends on the hash of the key, so they cannot be
// copied value by value: each old entry (from a hash map, as releases before
// tables kept subflows and police buckets, or from a table of an older
// layout) is converted by field names before anything changes, then stored
// through table_ctl once the new programs are loaded, before the links
// switch to them.

// tableIDs names the tables table_ctl knows by their map names.
var tableIDs = map[string]tableID{"subflows": tableSubflows, "rate_buckets": tablePolice}

// tableShape is where a table map's buckets keep their tags and entries, as
// its BTF says.
type tableShape struct {
	bucketSize, tagsOff, entriesOff, entrySize uint32
	ways                                       int
	keyOff, valueOff                           uint32
	key, value                                 btf.Type
	keySize, valueSize                         uint32
}

// tableShapeOf reads a table's layout from its bucket type: a struct with a
// head holding tag[] and an array e of entries, each a key then a value. ok
// is false for any other type (the map is not a table).
func tableShapeOf(bucket btf.Type) (s tableShape, ok bool, err error) {
	st, isStruct := btf.UnderlyingType(bucket).(*btf.Struct)
	if !isStruct {
		return s, false, nil
	}
	head, e := findMember(st, "head"), findMember(st, "e")
	if head == nil || e == nil {
		return s, false, nil
	}
	headSt, _ := btf.UnderlyingType(head.Type).(*btf.Struct)
	arr, _ := btf.UnderlyingType(e.Type).(*btf.Array)
	if headSt == nil || arr == nil {
		return s, false, nil
	}
	tags := findMember(headSt, "tag")
	entry, _ := btf.UnderlyingType(arr.Type).(*btf.Struct)
	if tags == nil || entry == nil {
		return s, false, errors.New("a table bucket without tags or entries")
	}
	key, value := findMember(entry, "key"), findMember(entry, "value")
	if key == nil || value == nil {
		return s, false, errors.New("a table entry without key or value")
	}
	s = tableShape{
		bucketSize: st.Size, tagsOff: head.Offset.Bytes() + tags.Offset.Bytes(), entriesOff: e.Offset.Bytes(),
		entrySize: entry.Size, ways: int(arr.Nelems), keyOff: key.Offset.Bytes(), valueOff: value.Offset.Bytes(),
		key: key.Type, value: value.Type,
	}
	ks, err := btf.Sizeof(key.Type)
	if err != nil {
		return s, false, err
	}
	vs, err := btf.Sizeof(value.Type)
	if err != nil {
		return s, false, err
	}
	s.keySize, s.valueSize = uint32(ks), uint32(vs)
	return s, true, nil
}

func findMember(st *btf.Struct, name string) *btf.Member {
	for i := range st.Members {
		if st.Members[i].Name == name {
			return &st.Members[i]
		}
	}
	return nil
}

// rawEntry is one entry of a map as its bytes, with the BTF to read them.
type rawEntry struct{ key, value []byte }

// entriesOf lists every entry of m, a table (its live ways) or a hash map,
// laid out as layout says; key and value types are returned with them.
func entriesOf(m *ebpf.Map, layout mapLayout) (entries []rawEntry, keyType, valueType btf.Type, err error) {
	shape, isTable, err := tableShapeOf(layout.Value)
	if err != nil {
		return nil, nil, nil, err
	}
	if !isTable {
		var k, v []byte
		it := m.Iterate()
		for it.Next(&k, &v) {
			entries = append(entries, rawEntry{key: clone(k), value: clone(v)})
		}
		return entries, layout.Key, layout.Value, it.Err()
	}
	var idx uint32
	var bucket []byte
	it := m.Iterate()
	for it.Next(&idx, &bucket) {
		for w := range shape.ways {
			if nativeEndian.Uint32(bucket[shape.tagsOff+4*uint32(w):])&tableTagLive == 0 {
				continue
			}
			e := bucket[shape.entriesOff+uint32(w)*shape.entrySize:]
			entries = append(entries, rawEntry{
				key:   clone(e[shape.keyOff : shape.keyOff+shape.keySize]),
				value: clone(e[shape.valueOff : shape.valueOff+shape.valueSize]),
			})
		}
	}
	return entries, shape.key, shape.value, it.Err()
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// convertEntries converts old entries into the new table's key and value
// types.
func convertEntries(old []rawEntry, oldKey, oldValue btf.Type, shape tableShape) ([]rawEntry, error) {
	out := make([]rawEntry, 0, len(old))
	for _, e := range old {
		nk, nv := make([]byte, shape.keySize), make([]byte, shape.valueSize)
		if err := convertValue(nk, shape.key, e.key, oldKey); err != nil {
			return nil, fmt.Errorf("key: %w", err)
		}
		if err := convertValue(nv, shape.value, e.value, oldValue); err != nil {
			return nil, err
		}
		out = append(out, rawEntry{key: nk, value: nv})
	}
	return out, nil
}

// readForTable reads and converts every entry of mm's old map for the new
// table.
func (mm *migratedMap) readForTable() ([]rawEntry, error) {
	shape, _, err := tableShapeOf(mm.newLayout.Value)
	if err != nil {
		return nil, err
	}
	old, oldKey, oldValue, err := entriesOf(mm.old, mm.oldLayout)
	if err != nil {
		return nil, err
	}
	entries, err := convertEntries(old, oldKey, oldValue, shape)
	if err != nil || !mm.renumber {
		return entries, err
	}
	for _, e := range entries {
		renumberPaths(e.key, shape.key)
		renumberPaths(e.value, shape.value)
	}
	return entries, nil
}

// fillTables stores the converted entries of every table being migrated,
// through this datapath's table_ctl (loaded against the new maps). An entry
// the new programs stored meanwhile is kept.
func (d *Datapath) fillTables() error {
	for _, mm := range d.migration.maps {
		if mm.tableEntries == nil {
			continue
		}
		n, err := d.storeInTable(mm.name, mm.tableEntries)
		if err != nil {
			return fmt.Errorf("filling table %s: %w", mm.name, err)
		}
		mm.copied, mm.tableEntries = n, nil
	}
	return nil
}

// storeInTable inserts entries not present yet into the table named name,
// and returns how many it stored.
func (d *Datapath) storeInTable(name string, entries []rawEntry) (int, error) {
	id, ok := tableIDs[name]
	if !ok {
		return 0, fmt.Errorf("no table_ctl table for map %s", name)
	}
	stored := 0
	for _, e := range entries {
		r, err := d.tableOp(id, datapathTableOpCodeTABLE_OP_INSERT_NEW, e.key, e.value)
		if err != nil {
			return stored, err
		}
		switch tableResult(r) {
		case datapathTableResultTABLE_INSERTED, datapathTableResultTABLE_EVICTED:
			stored++
		case datapathTableResultTABLE_EXISTS:
		default:
			return stored, errors.New("an entry was not stored: its bucket is being written")
		}
	}
	return stored, nil
}

// catchUpTable stores the entries the old programs added to a table's old
// map after the copy (a subflow placed in the meantime keeps its path).
func (d *Datapath) catchUpTable(mm *migratedMap) error {
	entries, err := mm.readForTable()
	if err != nil {
		return err
	}
	n, err := d.storeInTable(mm.name, entries)
	mm.caughtUp += n
	return err
}
