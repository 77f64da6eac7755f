// Package bpfutil holds the helpers of tests that read or attach BPF objects. It is
// apart from testutil so that tests which load no BPF do not link
// cilium/ebpf through it.
package bpfutil

import (
	"testing"

	"github.com/cilium/ebpf"
)

// PinnedMapID is the kernel's id of the map pinned at path.
func PinnedMapID(t testing.TB, path string) ebpf.MapID {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}
