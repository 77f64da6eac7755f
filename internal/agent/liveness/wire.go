package liveness

import (
	"encoding/binary"
	"errors"
)

// A probe and its echo are one UDP datagram of messageLen bytes:
//
//	0..3   "MPTL"
//	4      version (1)
//	5      kind: kindProbe or kindEcho
//	6      flags: zero in a probe; in an echo zero, flagHeldDown, or
//	       flagHeldDown|flagReady
//	7      zero
//	8..15  the prober's nonce, echoed unchanged
//	16..23 the probe's sequence number, echoed unchanged
//
// The nonce is a random number a prober draws for each peer on each path:
// an echo counts only when it carries it, so a sender that does not see
// the probes to that peer on that path cannot keep a dead path alive with
// forged echoes, nor take a live one down with a forged flag. Version 1 agents before the flags ignore an
// echo that carries one (they then count the probe lost, which is what the
// flags say anyway: flagReady comes only with flagHeldDown), and those
// that know flagHeldDown alone ignore one that carries flagReady too; from
// this release on, flags an agent does not know are ignored, not the echo.
const messageLen = 24

const (
	magic          = "MPTL"
	version        = 1
	kindProbe byte = 1
	kindEcho  byte = 2

	// flagHeldDown: the node that echoes holds the prober's node Down on
	// the path (target.heard).
	flagHeldDown byte = 1
	// flagReady, with flagHeldDown: the node that echoes would let the
	// prober's node Up by its own rules, and waits only for the prober to
	// let it Up too (target.mayComeUp).
	flagReady byte = 2
)

type message struct {
	kind  byte
	nonce uint64
	seq   uint64
	// heldDown (an echo's): the echoing node holds the prober Down;
	// ready, only with heldDown: it waits only for the prober.
	heldDown, ready bool
}

func (m message) marshal() []byte {
	b := make([]byte, messageLen)
	copy(b, magic)
	b[4], b[5] = version, m.kind
	if m.heldDown {
		b[6] = flagHeldDown
		if m.ready {
			b[6] |= flagReady
		}
	}
	binary.BigEndian.PutUint64(b[8:], m.nonce)
	binary.BigEndian.PutUint64(b[16:], m.seq)
	return b
}

var errNotAMessage = errors.New("not a liveness message")

// parseMessage accepts what marshal writes, and echoes with flags it does
// not know (read as marshal would write the ones it knows).
func parseMessage(b []byte) (message, error) {
	if len(b) != messageLen || string(b[:4]) != magic || b[4] != version || b[7] != 0 {
		return message{}, errNotAMessage
	}
	flags := b[6]
	m := message{kind: b[5], nonce: binary.BigEndian.Uint64(b[8:]), seq: binary.BigEndian.Uint64(b[16:])}
	switch {
	case m.kind == kindProbe && flags == 0:
	case m.kind == kindEcho:
		// Flags this release does not know are ignored: the next one
		// must not make this release count echoes lost, as flagHeldDown
		// did the release before it (and flagReady the one before
		// this).
		m.heldDown = flags&flagHeldDown != 0
		m.ready = m.heldDown && flags&flagReady != 0
	default:
		return message{}, errNotAMessage
	}
	return m, nil
}
