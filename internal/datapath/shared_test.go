package datapath

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// shared is the package's one datapath loaded as Load(Options{}) leaves it,
// for the tests that need no other: the verifier takes about 0.75 s of CPU
// to load the programs, which a suite run alongside others pays for every
// test that loads its own. Tests run one at a time here (none is parallel),
// and each gets the maps back as Load left them (snapshot, restore).
var shared struct {
	once sync.Once
	dp   *Datapath
	maps []mapSnapshot
	err  error
}

// loadForTest is the shared datapath, its maps as Load left them.
func loadForTest(t testing.TB) *Datapath {
	t.Helper()
	testutil.RequireRoot(t)
	shared.once.Do(func() {
		if shared.dp, shared.err = Load(Options{}); shared.err == nil {
			shared.maps, shared.err = snapshotMaps(shared.dp)
		}
	})
	if shared.err != nil {
		t.Fatalf("Load: %v", shared.err)
	}
	for _, s := range shared.maps {
		if err := s.restore(); err != nil {
			t.Fatalf("restoring the shared datapath's maps: %v", err)
		}
	}
	return shared.dp
}

// mapSnapshot is what one of the datapath's maps held: every entry of an
// array (per-CPU arrays hold zeros after Load, and get zeros back), the
// entries of a hash or trie, nothing of a map of maps (its slots are
// emptied).
type mapSnapshot struct {
	name    string
	m       *ebpf.Map
	entries map[string][]byte
}

func snapshotMaps(dp *Datapath) ([]mapSnapshot, error) {
	var out []mapSnapshot
	for name, m := range mapsByName(&dp.objs.datapathMaps) {
		s := mapSnapshot{name: name, m: m, entries: map[string][]byte{}}
		switch m.Type() {
		case ebpf.ArrayOfMaps:
		case ebpf.PerCPUArray:
			var key uint32
			var values [][]byte
			it := m.Iterate()
			for it.Next(&key, &values) {
				for _, v := range values {
					if slices.ContainsFunc(v, func(b byte) bool { return b != 0 }) {
						return nil, fmt.Errorf("map %s: entry %d is not zero after Load, and restore writes zeros", name, key)
					}
				}
			}
			if err := it.Err(); err != nil {
				return nil, fmt.Errorf("map %s: %w", name, err)
			}
		default:
			key, value := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
			it := m.Iterate()
			for it.Next(&key, &value) {
				s.entries[string(key)] = append([]byte(nil), value...)
			}
			if err := it.Err(); err != nil {
				return nil, fmt.Errorf("map %s: %w", name, err)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// restore gives s's map what the snapshot holds, and nothing else.
func (s mapSnapshot) restore() error {
	m := s.m
	switch m.Type() {
	case ebpf.Array:
		for k, v := range s.entries {
			if err := m.Update([]byte(k), v, ebpf.UpdateExist); err != nil {
				return fmt.Errorf("map %s: %w", s.name, err)
			}
		}
		return nil
	case ebpf.PerCPUArray:
		zero := make([][]byte, ebpf.MustPossibleCPU())
		for i := range zero {
			zero[i] = make([]byte, m.ValueSize())
		}
		for i := range m.MaxEntries() {
			if err := m.Update(i, zero, ebpf.UpdateExist); err != nil {
				return fmt.Errorf("map %s: %w", s.name, err)
			}
		}
		return nil
	case ebpf.ArrayOfMaps:
		for i := range m.MaxEntries() {
			if err := m.Delete(i); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("map %s: %w", s.name, err)
			}
		}
		return nil
	}
	var keys [][]byte
	key := make([]byte, m.KeySize())
	var prev any // nil: the first key
	for {
		if err := m.NextKey(prev, &key); errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		} else if err != nil {
			return fmt.Errorf("map %s: %w", s.name, err)
		}
		k := append([]byte(nil), key...)
		keys = append(keys, k)
		prev = k
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("map %s: %w", s.name, err)
		}
	}
	for k, v := range s.entries {
		if err := m.Put([]byte(k), v); err != nil {
			return fmt.Errorf("map %s: %w", s.name, err)
		}
	}
	return nil
}

// mapsByName are the maps of bpf2go's struct, by their ELF names.
func mapsByName(maps *datapathMaps) map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	v := reflect.ValueOf(maps).Elem()
	for i := range v.NumField() {
		if m, ok := v.Field(i).Interface().(*ebpf.Map); ok {
			out[v.Type().Field(i).Tag.Get("ebpf")] = m
		}
	}
	return out
}
