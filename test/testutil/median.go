package testutil

import (
	"cmp"
	"slices"
)

// Median is the middle of v's values in order, the upper of the two
// middle ones when there is an even number of them; v is left as it is.
// v must not be empty.
func Median[T cmp.Ordered](v []T) T {
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}

// MinMedian is the least of v and its Median; both are zero for an empty v.
func MinMedian[T cmp.Ordered](v []T) (lo, med T) {
	if len(v) == 0 {
		return lo, med
	}
	return slices.Min(v), Median(v)
}
