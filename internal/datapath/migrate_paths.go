package datapath

import (
	"github.com/cilium/ebpf/btf"
)

// Until 2026-12 the datapath numbered paths from 0: the API's index minus
// one, written into the mark plus one. Since, a path's index is the API's
// (MPTCPPath status.index, 1..MaxPaths) everywhere: in the mark, in the maps
// and in the routing table's offset. A node pinned by an earlier release is
// recognised by its subflow table, whose struct subflow then held the path
// in a member named "path" (now "path_index", renamedMembers); a migration
// from such a node adds one to every path index its maps hold, so that no
// live subflow, connection or counter changes path across the upgrade.

// renumberedMaps are the maps that hold path indexes besides the subflow
// table: migrated from a 0-based node even when their layout is the same.
// rate_classes is left out: the agent rewrites it whole at its first
// reconcile, and nothing else reads it.
var renumberedMaps = map[string]bool{
	"nics":          true,
	"rules":         true,
	"conn_states":   true,
	"rate_rules":    true,
	"rate_buckets":  true,
	"path_counters": true,
	"path_states":   true,
}

// pathIndexedMaps are arrays whose key is a path index.
var pathIndexedMaps = map[string]bool{"path_counters": true, "path_states": true}

// pathsNumberedFromZero says whether a map laid out as t (a subflow table's
// value, or a table bucket holding subflows) comes from a release that
// numbered paths from 0.
func pathsNumberedFromZero(t btf.Type) bool {
	found := false
	visit(t, 0, func(s *btf.Struct) {
		if s.Name == "subflow" && findMember(s, "path") != nil {
			found = true
		}
	})
	return found
}

// visit calls fn on every struct reachable from t, depth first.
func visit(t btf.Type, depth int, fn func(*btf.Struct)) {
	if depth > 16 {
		return
	}
	switch v := btf.UnderlyingType(t).(type) {
	case *btf.Struct:
		fn(v)
		for _, m := range v.Members {
			visit(m.Type, depth+1, fn)
		}
	case *btf.Union:
		for _, m := range v.Members {
			visit(m.Type, depth+1, fn)
		}
	case *btf.Array:
		visit(v.Type, depth+1, fn)
	}
}

// renumberPaths adds one to every path index held in b, laid out as t (a
// key or a value in this binary's layout, already converted from the old
// one).
func renumberPaths(b []byte, t btf.Type) {
	renumberIn(b, t, 0)
}

func renumberIn(b []byte, t btf.Type, depth int) {
	if depth > 16 {
		return
	}
	switch v := btf.UnderlyingType(t).(type) {
	case *btf.Array:
		size, err := btf.Sizeof(v.Type)
		if err != nil || size == 0 {
			return
		}
		for i := 0; i < int(v.Nelems) && (i+1)*size <= len(b); i++ {
			renumberIn(b[i*size:(i+1)*size], v.Type, depth+1)
		}
	case *btf.Struct:
		renumberStruct(b, v)
		for _, m := range v.Members {
			if m.BitfieldSize != 0 {
				continue
			}
			size, err := btf.Sizeof(m.Type)
			off := int(m.Offset.Bytes())
			if err != nil || off+size > len(b) {
				continue
			}
			renumberIn(b[off:off+size], m.Type, depth+1)
		}
	}
}

// renumberStruct adjusts the members of the structs that hold path indexes
// (bpf/include/common.h and rate.h), by name.
func renumberStruct(b []byte, s *btf.Struct) {
	field := func(name string) []byte {
		m := findMember(s, name)
		if m == nil || m.BitfieldSize != 0 {
			return nil
		}
		size, err := btf.Sizeof(m.Type)
		off := int(m.Offset.Bytes())
		if err != nil || off+size > len(b) {
			return nil
		}
		return b[off : off+size]
	}
	switch s.Name {
	case "nic":
		addOne(field("path"))
	case "conn":
		shiftBits(field("used"))
	case "rule":
		shiftBits(field("blocked"))
		n, paths := field("npaths"), field("paths")
		if len(n) == 4 && paths != nil {
			for i := 0; i < int(nativeEndian.Uint32(n)) && i < len(paths); i++ {
				paths[i]++
			}
		}
	case "rate_cfg":
		shiftElements(field("path_bps"), 8)
		shiftElements(field("path_gcra"), sizeOf(findMember(s, "path_gcra")))
	case "rate_key":
		if kind := field("kind"); len(kind) == 1 && kind[0] == rateKindPath {
			addOne(field("id"))
		}
	}
}

func sizeOf(m *btf.Member) int {
	if m == nil {
		return 0
	}
	a, ok := btf.UnderlyingType(m.Type).(*btf.Array)
	if !ok || a.Nelems == 0 {
		return 0
	}
	size, err := btf.Sizeof(a.Type)
	if err != nil {
		return 0
	}
	return size
}

// addOne adds one to a little-endian unsigned integer of 1, 2, 4 or 8 bytes.
func addOne(b []byte) {
	for i := range b {
		b[i]++
		if b[i] != 0 {
			return
		}
	}
}

// shiftBits moves every bit of a 32-bit set of path indexes one up.
func shiftBits(b []byte) {
	if len(b) == 4 {
		nativeEndian.PutUint32(b, nativeEndian.Uint32(b)<<1)
	}
}

// shiftElements moves the elements of an array indexed by path one up; the
// last (no path of the old numbering) falls off, the first becomes zero.
func shiftElements(b []byte, size int) {
	if size <= 0 || len(b) < size {
		return
	}
	copy(b[size:], b[:len(b)-size])
	clear(b[:size])
}
