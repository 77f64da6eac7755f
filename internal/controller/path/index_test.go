package path

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

func TestAssignIndexes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := func(name string, age int, index int32) mptcpv1alpha1.MPTCPPath {
		return mptcpv1alpha1.MPTCPPath{
			ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Second))},
			Status:     mptcpv1alpha1.MPTCPPathStatus{Index: index},
		}
	}
	many := func(n int) []mptcpv1alpha1.MPTCPPath {
		var out []mptcpv1alpha1.MPTCPPath
		for i := range n {
			out = append(out, p(fmt.Sprintf("p%03d", i), i, 0))
		}
		return out
	}
	cases := map[string]struct {
		paths []mptcpv1alpha1.MPTCPPath // with their current status.index
		want  map[string]int32          // index of each named path afterwards
	}{
		"new paths get the lowest free indexes, oldest first": {
			paths: []mptcpv1alpha1.MPTCPPath{p("b", 2, 0), p("a", 1, 0)},
			want:  map[string]int32{"a": 1, "b": 2},
		},
		"existing indexes are kept, gaps are filled": {
			paths: []mptcpv1alpha1.MPTCPPath{p("a", 1, 3), p("b", 2, 0), p("c", 3, 1)},
			want:  map[string]int32{"a": 3, "b": 2, "c": 1},
		},
		"on a duplicate the older path keeps the index": {
			paths: []mptcpv1alpha1.MPTCPPath{p("young", 5, 1), p("old", 1, 1)},
			want:  map[string]int32{"old": 1, "young": 2},
		},
		"same age: by name": {
			paths: []mptcpv1alpha1.MPTCPPath{p("b", 1, 0), p("a", 1, 0)},
			want:  map[string]int32{"a": 1, "b": 2},
		},
		"beyond the index space a path gets none": {
			paths: many(mptcpv1alpha1.MaxPathIndex + 1),
			want:  map[string]int32{"p000": 1, "p014": 15, "p015": 0},
		},
		// A path that an earlier controller numbered beyond the datapath's
		// 15 paths (every agent refused it) gets an index that works.
		"an index beyond the datapath's is replaced": {
			paths: []mptcpv1alpha1.MPTCPPath{p("a", 1, 40), p("b", 2, 1)},
			want:  map[string]int32{"a": 2, "b": 1},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := AssignIndexes(tc.paths)
			for n, w := range tc.want {
				if got[n] != w {
					t.Errorf("%s: index %d, want %d (all: %v)", n, got[n], w, got)
				}
			}
		})
	}
}
