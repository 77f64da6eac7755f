package main

import "testing"

// The sink finds the first changed byte wherever the stream is in the
// pattern, across the pattern's end, and nothing in an unchanged stream.
func TestFirstDifferenceFindsTheFirstChangedByte(t *testing.T) {
	pattern := []byte("abcdefgh")
	if got := firstDifference([]byte("cdefghabcdef"), pattern, 2); got != -1 {
		t.Errorf("unchanged stream: first difference at %d, want -1", got)
	}
	if got := firstDifference([]byte("cdefghaXcdef"), pattern, 2); got != 9 {
		t.Errorf("changed byte at stream offset 9 found at %d", got)
	}
	if got := firstDifference([]byte("Xbc"), pattern, 16); got != 16 {
		t.Errorf("changed byte at stream offset 16 found at %d", got)
	}
}
