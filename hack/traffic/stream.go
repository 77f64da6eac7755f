package main

import (
	"bytes"
	"encoding/hex"
	"io"

	"github.com/mptcp-operator/mptcp-operator/hack/traffic/report"
	"github.com/mptcp-operator/mptcp-operator/hack/traffic/stream"
)

const preambleLen = stream.PreambleLen

// How much a verifier records of a changed stream: enough to find the
// packets in a capture, bounded so that a stream changed from its first
// byte on does not grow the report without end.
const (
	maxDiffRanges = 32
	sampleLen     = 32
	// searchWindow is how far around a changed range the verifier looks
	// for the bytes that arrived there in the sent stream (data placed
	// at the wrong offset shows up as a shift).
	searchWindow = 8 << 20
)

// verifier compares a received stream with the one its preamble names.
type verifier struct {
	head     []byte // the preamble, until it is complete
	want     io.Reader
	wantBuf  []byte
	offset   int64 // stream offset of the next byte (preamble included)
	seed     uint64
	conn     int
	verified bool
	ranges   []report.Range
	samples  []report.Sample
	gotKeep  map[int64][]byte // received bytes at the start of each sampled range
}

func newVerifier() *verifier { return &verifier{gotKeep: map[int64][]byte{}} }

// Write feeds the next received bytes.
func (v *verifier) Write(p []byte) {
	if len(v.head) < preambleLen {
		n := min(len(p), preambleLen-len(v.head))
		v.head = append(v.head, p[:n]...)
		p = p[n:]
		v.offset += int64(n)
		if len(v.head) < preambleLen {
			return
		}
		seed, conn, ok := stream.ParsePreamble(v.head)
		if !ok {
			return
		}
		v.seed, v.conn, v.verified = seed, conn, true
		v.want = stream.Payload(seed, conn)
	}
	if !v.verified {
		v.offset += int64(len(p))
		return
	}
	if cap(v.wantBuf) < len(p) {
		v.wantBuf = make([]byte, len(p))
	}
	want := v.wantBuf[:len(p)]
	_, _ = io.ReadFull(v.want, want)
	if !bytes.Equal(p, want) {
		v.recordDifferences(p, want)
	}
	v.offset += int64(len(p))
}

// recordDifferences notes the byte ranges of got that differ from want,
// merging a range that continues the last one.
func (v *verifier) recordDifferences(got, want []byte) {
	for i := 0; i < len(got); {
		if got[i] == want[i] {
			i++
			continue
		}
		j := i
		for j < len(got) && got[j] != want[j] {
			j++
		}
		start, end := v.offset+int64(i), v.offset+int64(j)
		if n := len(v.ranges); n > 0 && v.ranges[n-1].End >= start-64 {
			// Bytes that happen to agree inside a changed stretch do not
			// split it.
			v.ranges[n-1].End = end
		} else if n < maxDiffRanges {
			v.ranges = append(v.ranges, report.Range{Start: start, End: end})
			s := report.Sample{Offset: start, Got: hex.EncodeToString(got[i:min(i+sampleLen, len(got))]),
				Want: hex.EncodeToString(want[i:min(i+sampleLen, len(want))]), FoundAt: -1}
			v.samples = append(v.samples, s)
			v.gotKeep[start] = bytes.Clone(got[i:min(i+sampleLen, len(got))])
		} else {
			v.ranges[n-1].Truncated = true
		}
		i = j
	}
}

// result returns what the verifier found; for each sampled range it looks
// in the sent stream, around the range, for the bytes that arrived there.
func (v *verifier) result() *report.Verification {
	if !v.verified {
		return &report.Verification{Verified: false}
	}
	r := &report.Verification{Verified: true, Seed: v.seed, Conn: v.conn, Ranges: v.ranges}
	for i := range v.samples {
		s := &v.samples[i]
		if got := v.gotKeep[s.Offset]; len(got) >= 16 {
			s.FoundAt = v.find(got, s.Offset)
		}
	}
	r.Samples = v.samples
	return r
}

// find returns the stream offset where b occurs in the sent stream within
// searchWindow of near, or -1.
func (v *verifier) find(b []byte, near int64) int64 {
	from := max(preambleLen, near-searchWindow)
	s := stream.Payload(v.seed, v.conn)
	// The generator has no seek: skip to the window, then read it.
	if _, err := io.CopyN(io.Discard, s, from-preambleLen); err != nil {
		return -1
	}
	window := make([]byte, near+searchWindow-from)
	_, _ = io.ReadFull(s, window)
	if i := bytes.Index(window, b); i >= 0 {
		return from + int64(i)
	}
	return -1
}
