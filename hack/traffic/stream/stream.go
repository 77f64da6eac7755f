// Package stream defines the byte streams hack/traffic sends: a preamble
// that names the stream, then a deterministic payload. A receiver (the
// traffic server) or a tool reading a capture can regenerate what was sent
// from the preamble alone.
package stream

import (
	"bytes"
	"encoding/binary"
	"io"
	"math/rand/v2"
)

// Every stream starts with a preamble that names it:
//
//	magic "MPTCPSTR" | version 1 | 7 bytes zero | seed (LE u64) | connection (LE u64)
//
// The preamble is part of the stream: both ends count and hash it.
const (
	magic   = "MPTCPSTR"
	version = 1
	// PreambleLen is the preamble's length in bytes.
	PreambleLen = 32
)

// Preamble returns the preamble of connection conn of seed.
func Preamble(seed uint64, conn int) []byte {
	p := make([]byte, PreambleLen)
	copy(p, magic)
	p[8] = version
	binary.LittleEndian.PutUint64(p[16:], seed)
	binary.LittleEndian.PutUint64(p[24:], uint64(conn))
	return p
}

// ParsePreamble returns the stream a preamble names, or ok false when p is
// not one (another client, or a preamble that arrived changed).
func ParsePreamble(p []byte) (seed uint64, conn int, ok bool) {
	if len(p) < PreambleLen || string(p[:8]) != magic || p[8] != version {
		return 0, 0, false
	}
	return binary.LittleEndian.Uint64(p[16:]), int(binary.LittleEndian.Uint64(p[24:])), true
}

// Payload returns the bytes after the preamble: ChaCha8 keyed by the seed
// and the connection.
func Payload(seed uint64, conn int) io.Reader {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[0:], seed)
	binary.LittleEndian.PutUint64(key[8:], uint64(conn))
	return rand.NewChaCha8(key)
}

// Whole returns the whole stream, preamble and payload.
func Whole(seed uint64, conn int) io.Reader {
	return io.MultiReader(bytes.NewReader(Preamble(seed, conn)), Payload(seed, conn))
}

// Range returns the n bytes of the stream from offset off (preamble
// included in the offsets). The generator cannot seek: it runs from the
// start.
func Range(seed uint64, conn int, off, n int64) []byte {
	s := Whole(seed, conn)
	if _, err := io.CopyN(io.Discard, s, off); err != nil {
		return nil
	}
	b := make([]byte, n)
	_, _ = io.ReadFull(s, b)
	return b
}
