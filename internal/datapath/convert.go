package datapath

import (
	"fmt"

	"github.com/cilium/ebpf/btf"
)

// convertValue writes src, laid out as st, into dst, laid out as dt, field by
// field: members are matched by name (recursively through nested structs,
// unions and arrays), members only dst has stay zero, members only src has
// are dropped. Integers and enums may widen, or narrow when the value fits;
// anything else that changed kind is an error, as is a value that would not
// fit: the caller then gives the migration up rather than corrupt state.
func convertValue(dst []byte, dt btf.Type, src []byte, st btf.Type) error {
	if dt == nil || st == nil {
		// Without BTF on both sides only identical bytes can be carried.
		if dt == nil && st == nil && len(dst) == len(src) {
			copy(dst, src)
			return nil
		}
		return fmt.Errorf("no BTF to convert %d bytes into %d", len(src), len(dst))
	}
	return convert(dst, dt, src, st, "")
}

func convert(dst []byte, dt btf.Type, src []byte, st btf.Type, at string) error {
	dt, st = btf.UnderlyingType(dt), btf.UnderlyingType(st)
	switch d := dt.(type) {
	case *btf.Int, *btf.Enum:
		return convertInt(dst, d, src, st, at)
	case *btf.Array:
		s, ok := st.(*btf.Array)
		if !ok {
			return fmt.Errorf("%s: was %T, is an array", name(at), st)
		}
		dsz, err := btf.Sizeof(d.Type)
		if err != nil {
			return err
		}
		ssz, err := btf.Sizeof(s.Type)
		if err != nil {
			return err
		}
		for i := 0; i < int(min(d.Nelems, s.Nelems)); i++ {
			if err := convert(dst[i*dsz:(i+1)*dsz], d.Type, src[i*ssz:(i+1)*ssz], s.Type, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
		return nil
	case *btf.Struct:
		s, ok := st.(*btf.Struct)
		if !ok {
			return fmt.Errorf("%s: was %T, is a struct", name(at), st)
		}
		return convertMembers(dst, d.Name, d.Members, src, s.Members, at)
	case *btf.Union:
		s, ok := st.(*btf.Union)
		if !ok {
			return fmt.Errorf("%s: was %T, is a union", name(at), st)
		}
		return convertMembers(dst, "", d.Members, src, s.Members, at)
	default:
		return fmt.Errorf("%s: cannot convert %T", name(at), dt)
	}
}

func name(at string) string {
	if at == "" {
		return "value"
	}
	return at
}

// renamedMember is a struct member that a release renamed because its
// meaning changed: a value of the old member is carried into the new one
// through adjust, or, with intoFirst, into the first element of the new
// member, an array of what the old one was.
type renamedMember struct {
	from      string
	adjust    func(dst []byte)
	intoFirst bool
}

// renamedMembers are keyed by struct and new member name.
var renamedMembers = map[string]renamedMember{
	// Path indexes count from 1, as the API's (migrate_paths.go).
	"subflow.path_index": {from: "path", adjust: addOne},
	// A pod's one rule became its selector chain: the old rule is a chain
	// of one, so that the agent adopts its id for the pod's rule and no
	// live connection changes rule across the upgrade.
	"endpoint.rules":  {from: "rule", intoFirst: true},
	"endpoint.nrules": {from: "rule", adjust: setOne},
}

// setOne sets a little-endian unsigned integer to 1.
func setOne(b []byte) {
	clear(b)
	b[0] = 1
}

// convertMembers matches named members by name (or by their name before a
// rename, renamedMembers) and anonymous ones (nested anonymous structs and
// unions) by their order among anonymous members.
func convertMembers(dst []byte, structName string, dms []btf.Member, src []byte, sms []btf.Member, at string) error {
	byName := map[string]btf.Member{}
	var anon []btf.Member
	for _, m := range sms {
		if m.Name == "" {
			anon = append(anon, m)
		} else {
			byName[m.Name] = m
		}
	}
	nanon := 0
	for _, dm := range dms {
		var sm btf.Member
		var ok bool
		if dm.Name == "" {
			if ok = nanon < len(anon); ok {
				sm = anon[nanon]
			}
			nanon++
		} else {
			sm, ok = byName[dm.Name]
		}
		var adjust func([]byte)
		dt := dm.Type
		if r, renamed := renamedMembers[structName+"."+dm.Name]; !ok && renamed && structName != "" {
			sm, ok = byName[r.from]
			adjust = r.adjust
			if arr, isArray := btf.UnderlyingType(dm.Type).(*btf.Array); ok && r.intoFirst && isArray && arr.Nelems > 0 {
				dt = arr.Type
			}
		}
		if !ok {
			continue // new member: zero
		}
		field := at + "." + dm.Name
		if dm.BitfieldSize != 0 || sm.BitfieldSize != 0 {
			if dm.BitfieldSize != sm.BitfieldSize || dm.Offset != sm.Offset {
				return fmt.Errorf("%s: bitfield moved or resized", field)
			}
			// Same bits in the same place: copy the bytes that hold them.
			lo, hi := dm.Offset.Bytes(), (uint32(dm.Offset)+uint32(dm.BitfieldSize)+7)/8
			copyBits(dst[lo:hi], src[lo:hi], uint32(dm.Offset)%8, uint32(dm.BitfieldSize))
			continue
		}
		dsz, err := btf.Sizeof(dt)
		if err != nil {
			return err
		}
		ssz, err := btf.Sizeof(sm.Type)
		if err != nil {
			return err
		}
		do, so := int(dm.Offset.Bytes()), int(sm.Offset.Bytes())
		if do+dsz > len(dst) || so+ssz > len(src) {
			return fmt.Errorf("%s: outside the value", field)
		}
		if err := convert(dst[do:do+dsz], dt, src[so:so+ssz], sm.Type, field); err != nil {
			return err
		}
		if adjust != nil {
			adjust(dst[do : do+dsz])
		}
	}
	return nil
}

// copyBits copies n bits starting at bit off of src into dst (little-endian
// bit order, as bitfields lie on the machines BPF runs on).
func copyBits(dst, src []byte, off, n uint32) {
	for i := off; i < off+n; i++ {
		mask := byte(1) << (i % 8)
		dst[i/8] = dst[i/8]&^mask | src[i/8]&mask
	}
}

func intInfo(t btf.Type) (size int, signed, ok bool) {
	switch v := t.(type) {
	case *btf.Int:
		return int(v.Size), v.Encoding&btf.Signed != 0, true
	case *btf.Enum:
		return int(v.Size), v.Signed, true
	}
	return 0, false, false
}

func convertInt(dst []byte, dt btf.Type, src []byte, st btf.Type, at string) error {
	dsz, dsigned, _ := intInfo(dt)
	ssz, ssigned, ok := intInfo(st)
	if !ok {
		return fmt.Errorf("%s: was %T, is an integer", name(at), st)
	}
	if dsz > 8 || ssz > 8 {
		// 128-bit integers: carried only as they are.
		if dsz != ssz {
			return fmt.Errorf("%s: %d-byte integer resized to %d", name(at), ssz, dsz)
		}
		copy(dst, src)
		return nil
	}
	var u uint64
	for i := ssz - 1; i >= 0; i-- {
		u = u<<8 | uint64(src[i])
	}
	if ssigned && ssz < 8 && u&(1<<(ssz*8-1)) != 0 {
		u |= ^uint64(0) << (ssz * 8) // sign-extend
	}
	if dsz < 8 {
		// Narrowing: the value must survive the round trip.
		back := u & (1<<(dsz*8) - 1)
		if dsigned && back&(1<<(dsz*8-1)) != 0 {
			back |= ^uint64(0) << (dsz * 8)
		}
		if back != u {
			return fmt.Errorf("%s: value %d does not fit in %d bytes", name(at), int64(u), dsz)
		}
	}
	for i := 0; i < dsz; i++ {
		dst[i] = byte(u >> (8 * i))
	}
	return nil
}

// addDeltas adds, to every integer field of dst (laid out as t), the
// difference now-base of the same field: how far a counter moved in the
// old map after it was copied. Unsigned arithmetic wraps as counters do.
func addDeltas(dst, now, base []byte, t btf.Type) {
	t = btf.UnderlyingType(t)
	switch v := t.(type) {
	case *btf.Int, *btf.Enum:
		sz, _, _ := intInfo(v)
		if sz > 8 {
			return
		}
		get := func(b []byte) uint64 {
			var u uint64
			for i := sz - 1; i >= 0; i-- {
				u = u<<8 | uint64(b[i])
			}
			return u
		}
		sum := get(dst) + get(now) - get(base)
		for i := 0; i < sz; i++ {
			dst[i] = byte(sum >> (8 * i))
		}
	case *btf.Array:
		esz, err := btf.Sizeof(v.Type)
		if err != nil {
			return
		}
		for i := 0; i < int(v.Nelems); i++ {
			addDeltas(dst[i*esz:(i+1)*esz], now[i*esz:(i+1)*esz], base[i*esz:(i+1)*esz], v.Type)
		}
	case *btf.Struct:
		for _, m := range v.Members {
			if m.BitfieldSize != 0 {
				continue
			}
			sz, err := btf.Sizeof(m.Type)
			if err != nil {
				continue
			}
			o := int(m.Offset.Bytes())
			addDeltas(dst[o:o+sz], now[o:o+sz], base[o:o+sz], m.Type)
		}
	}
}
