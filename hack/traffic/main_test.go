package main

import (
	"bytes"
	"io"
	"testing"
)

// The sender's streams must be reproducible from (seed, connection) alone, and differ between connections, so
// that a receiver's hash identifies exactly one stream.
func TestStreamIsDeterministicPerConnection(t *testing.T) {
	read := func(seed uint64, i int) []byte {
		b := make([]byte, 1<<16)
		if _, err := io.ReadFull(stream(seed, i), b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	if !bytes.Equal(read(7, 0), read(7, 0)) {
		t.Error("the same seed and connection gave different streams")
	}
	if bytes.Equal(read(7, 0), read(7, 1)) {
		t.Error("two connections of one seed sent the same stream")
	}
	if bytes.Equal(read(7, 0), read(8, 0)) {
		t.Error("two seeds gave the same stream")
	}
}
