package main

import (
	"github.com/mptcp-operator/mptcp-operator/hack/traffic/stream"

	"bytes"
	"io"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/hack/traffic/report"
)

// sent returns the first n bytes connection conn of seed sends, preamble included.
func sent(t *testing.T, seed uint64, conn int, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := io.ReadFull(stream.Whole(seed, conn), b); err != nil {
		t.Fatal(err)
	}
	return b
}

// verify feeds b to a verifier in reads of the given size, as a socket
// would hand it over.
func verify(b []byte, read int) *report.Verification {
	v := newVerifier()
	for len(b) > 0 {
		n := min(read, len(b))
		v.Write(b[:n])
		b = b[n:]
	}
	return v.result()
}

func TestVerifierFindsNothingInAWholeStream(t *testing.T) {
	for _, read := range []int{1, 7, 1448, 256 << 10} {
		r := verify(sent(t, 3, 1, 1<<20), read)
		if !r.Verified || r.Seed != 3 || r.Conn != 1 || len(r.Ranges) != 0 {
			t.Errorf("reads of %d bytes: %+v, want a verified stream (3, 1) with no changed range", read, r)
		}
	}
}

// A stretch overwritten with bytes never sent, and a stretch holding data
// from elsewhere in the stream, are told apart: the second is found in the
// sent stream at the offset it came from.
func TestVerifierLocatesChangedAndMisplacedBytes(t *testing.T) {
	b := sent(t, 9, 0, 4<<20)
	for i := 100_000; i < 100_300; i++ {
		b[i] ^= 0x5a
	}
	copy(b[2_000_000:2_001_448], sent(t, 9, 0, 3_000_000)[2_500_000:2_501_448])
	r := verify(b, 64<<10)
	if len(r.Ranges) != 2 {
		t.Fatalf("ranges %+v, want two", r.Ranges)
	}
	if r.Ranges[0].Start != 100_000 || r.Ranges[0].End != 100_300 {
		t.Errorf("first range %+v, want [100000, 100300)", r.Ranges[0])
	}
	// Random bytes may agree by chance at either edge of the copy.
	if r.Ranges[1].Start < 2_000_000 || r.Ranges[1].Start > 2_000_004 || r.Ranges[1].End < 2_001_444 || r.Ranges[1].End > 2_001_448 {
		t.Errorf("second range %+v, want about [2000000, 2001448)", r.Ranges[1])
	}
	if r.Samples[0].FoundAt != -1 {
		t.Errorf("flipped bytes found in the sent stream at %d", r.Samples[0].FoundAt)
	}
	if want := int64(2_500_000) + (r.Ranges[1].Start - 2_000_000); r.Samples[1].FoundAt != want {
		t.Errorf("misplaced bytes found at %d, want %d", r.Samples[1].FoundAt, want)
	}
}

func TestVerifierBoundsWhatItRecords(t *testing.T) {
	b := sent(t, 1, 0, 1<<20)
	for i := preambleLen; i < len(b); i += 1000 {
		b[i] ^= 1
	}
	r := verify(b, 4096)
	if len(r.Ranges) != maxDiffRanges || !r.Ranges[maxDiffRanges-1].Truncated {
		t.Errorf("%d ranges, last %+v: want %d, the last marked truncated", len(r.Ranges), r.Ranges[len(r.Ranges)-1], maxDiffRanges)
	}
}

func TestStreamWithoutPreambleIsNotVerified(t *testing.T) {
	if r := verify(bytes.Repeat([]byte("x"), 1000), 100); r.Verified {
		t.Errorf("%+v: a stream without a preamble was verified", r)
	}
}
