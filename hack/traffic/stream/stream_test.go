package stream

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
		if _, err := io.ReadFull(Payload(seed, i), b); err != nil {
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

func TestRangeIsTheStreamAtAnOffset(t *testing.T) {
	whole := make([]byte, 100_000)
	if _, err := io.ReadFull(Whole(3, 2), whole); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(Range(3, 2, 0, PreambleLen), Preamble(3, 2)) {
		t.Error("the stream does not start with its preamble")
	}
	if !bytes.Equal(Range(3, 2, 54_321, 1000), whole[54_321:55_321]) {
		t.Error("Range differs from the whole stream at the same offset")
	}
	if seed, conn, ok := ParsePreamble(whole); !ok || seed != 3 || conn != 2 {
		t.Errorf("ParsePreamble: %d %d %v, want 3 2 true", seed, conn, ok)
	}
}
