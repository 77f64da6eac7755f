package testutil

import (
	"testing"
	"time"
)

func TestMedianTakesTheUpperMiddleAndLeavesItsInputAlone(t *testing.T) {
	v := []float64{5, 1, 4, 2}
	if got := Median(v); got != 4 {
		t.Errorf("Median(%v) = %v, want 4 (the upper of 2 and 4)", v, got)
	}
	if v[0] != 5 || v[1] != 1 {
		t.Errorf("Median sorted its input: %v", v)
	}
	lo, med := MinMedian([]time.Duration{3, 1, 2})
	if lo != 1 || med != 2 {
		t.Errorf("MinMedian(3, 1, 2) = %v, %v; want 1, 2", lo, med)
	}
	if lo, med := MinMedian([]float64(nil)); lo != 0 || med != 0 {
		t.Errorf("MinMedian of nothing = %v, %v; want 0, 0", lo, med)
	}
}
