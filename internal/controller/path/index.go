// Package path assigns every MPTCPPath its cluster-wide index and reports,
// in the path's status, on how many nodes it exists and where its agent
// found no interface for it.
package path

import (
	"cmp"
	"slices"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// AssignIndexes gives each path an index in [1, MaxPathIndex]. A path keeps
// the index it has (marks of live connections depend on it) unless an older
// path holds the same one; new paths get the lowest free index, oldest
// first. Paths beyond the index space get 0. The result depends only on the
// paths, not on the order they are listed in, so concurrent reconciles agree.
func AssignIndexes(paths []mptcpv1alpha1.MPTCPPath) map[string]int32 {
	sorted := slices.Clone(paths)
	slices.SortFunc(sorted, func(a, b mptcpv1alpha1.MPTCPPath) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	out := make(map[string]int32, len(sorted))
	taken := map[int32]bool{}
	const maxIndex = int32(mptcpv1alpha1.MaxPathIndex)
	for _, p := range sorted {
		i := p.Status.Index
		if i >= 1 && i <= maxIndex && !taken[i] {
			taken[i] = true
			out[p.Name] = i
		}
	}
	next := int32(1)
	for _, p := range sorted {
		if _, ok := out[p.Name]; ok {
			continue
		}
		for next <= maxIndex && taken[next] {
			next++
		}
		if next > maxIndex {
			out[p.Name] = 0
			continue
		}
		taken[next] = true
		out[p.Name] = next
	}
	return out
}
