package datapath

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// mapLayout is what decides whether a pinned map can serve a new binary's
// programs as it is: the kernel's own compatibility check (type, sizes,
// max entries, flags) plus the BTF of key and value, because a field
// renamed or moved inside a value of the same size (a pad becoming a rule
// index) would otherwise be read with the wrong meaning.
type mapLayout struct {
	Type                           ebpf.MapType
	KeySize, ValueSize, MaxEntries uint32
	Flags                          uint32
	Key, Value                     btf.Type
}

func specLayout(ms *ebpf.MapSpec) mapLayout {
	return mapLayout{Type: ms.Type, KeySize: ms.KeySize, ValueSize: ms.ValueSize, MaxEntries: ms.MaxEntries, Flags: ms.Flags, Key: ms.Key, Value: ms.Value}
}

// String is a canonical description: equal strings mean the same layout.
func (l mapLayout) String() string {
	return fmt.Sprintf("%s max=%d flags=%#x key(%d)=%s value(%d)=%s", l.Type, l.MaxEntries, l.Flags, l.KeySize, describeType(l.Key), l.ValueSize, describeType(l.Value))
}

// describeType spells a BTF type out by structure: member names, offsets,
// sizes and kinds, not type names (renaming a struct changes nothing in
// memory).
func describeType(t btf.Type) string {
	var b strings.Builder
	writeType(&b, t, 0)
	return b.String()
}

func writeType(b *strings.Builder, t btf.Type, depth int) {
	if depth > 32 {
		b.WriteString("...")
		return
	}
	switch v := btf.UnderlyingType(t).(type) {
	case nil:
		b.WriteString("none")
	case *btf.Int:
		fmt.Fprintf(b, "int%d", v.Size*8)
		if v.Encoding&btf.Signed != 0 {
			b.WriteString("s")
		}
	case *btf.Enum:
		fmt.Fprintf(b, "enum%d", v.Size*8)
		if v.Signed {
			b.WriteString("s")
		}
	case *btf.Array:
		fmt.Fprintf(b, "[%d]", v.Nelems)
		writeType(b, v.Type, depth+1)
	case *btf.Struct:
		writeMembers(b, "struct", v.Size, v.Members, depth)
	case *btf.Union:
		writeMembers(b, "union", v.Size, v.Members, depth)
	case *btf.Pointer:
		b.WriteString("ptr")
	default:
		fmt.Fprintf(b, "%T", v)
	}
}

func writeMembers(b *strings.Builder, kind string, size uint32, ms []btf.Member, depth int) {
	fmt.Fprintf(b, "%s%d{", kind, size)
	for i, m := range ms {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(b, "%s@%d", m.Name, m.Offset)
		if m.BitfieldSize != 0 {
			fmt.Fprintf(b, ":%d", m.BitfieldSize)
		}
		b.WriteString("=")
		writeType(b, m.Type, depth+1)
	}
	b.WriteString("}")
}

// layoutHash digests the layouts of every pinned map of a collection: the
// marker that lets a restart of the same binary skip the per-map comparison.
func layoutHash(spec *ebpf.CollectionSpec) string {
	names := pinnedMapNames(spec)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s: %s\n", n, specLayout(spec.Maps[n]))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// pinnedMapNames lists, sorted, the maps of spec that live under the pin
// directory.
func pinnedMapNames(spec *ebpf.CollectionSpec) []string {
	var names []string
	for n, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinByName {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// kernelMapInfo is the head of struct bpf_map_info (include/uapi/linux/bpf.h)
// up to the BTF type ids, which cilium/ebpf's MapInfo does not expose.
type kernelMapInfo struct {
	Type, ID, KeySize, ValueSize, MaxEntries, MapFlags uint32
	Name                                               [16]byte
	Ifindex, BTFVmlinuxValueTypeID                     uint32
	NetnsDev, NetnsIno                                 uint64
	BTFID, BTFKeyTypeID, BTFValueTypeID, BTFVmlinuxID  uint32
	MapExtra                                           uint64
}

const bpfObjGetInfoByFD = 15 // BPF_OBJ_GET_INFO_BY_FD

func mapInfo(m *ebpf.Map) (kernelMapInfo, error) {
	var info kernelMapInfo
	attr := struct {
		fd, infoLen uint32
		info        uint64
	}{uint32(m.FD()), uint32(unsafe.Sizeof(info)), uint64(uintptr(unsafe.Pointer(&info)))}
	_, _, errno := unix.Syscall(unix.SYS_BPF, bpfObjGetInfoByFD, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		return info, fmt.Errorf("BPF_OBJ_GET_INFO_BY_FD: %w", errno)
	}
	return info, nil
}

// kernelLayout reads the layout of a map in the kernel, with key and value
// types from the BTF the map was created with. A map without BTF gets nil
// types: it can only be reused, never converted.
func kernelLayout(m *ebpf.Map) (mapLayout, error) {
	info, err := mapInfo(m)
	if err != nil {
		return mapLayout{}, err
	}
	l := mapLayout{Type: m.Type(), KeySize: info.KeySize, ValueSize: info.ValueSize, MaxEntries: info.MaxEntries, Flags: info.MapFlags}
	if info.BTFID == 0 {
		return l, nil
	}
	h, err := btf.NewHandleFromID(btf.ID(info.BTFID))
	if err != nil {
		return l, fmt.Errorf("map BTF %d: %w", info.BTFID, err)
	}
	defer h.Close()
	spec, err := h.Spec(nil)
	if err != nil {
		return l, fmt.Errorf("map BTF %d: %w", info.BTFID, err)
	}
	if info.BTFKeyTypeID != 0 {
		if l.Key, err = spec.TypeByID(btf.TypeID(info.BTFKeyTypeID)); err != nil {
			return l, fmt.Errorf("map BTF key type: %w", err)
		}
	}
	if info.BTFValueTypeID != 0 {
		if l.Value, err = spec.TypeByID(btf.TypeID(info.BTFValueTypeID)); err != nil {
			return l, fmt.Errorf("map BTF value type: %w", err)
		}
	}
	return l, nil
}

var nativeEndian = binary.NativeEndian
