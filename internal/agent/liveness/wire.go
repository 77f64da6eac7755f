package liveness

import (
	"encoding/binary"
	"errors"
)

// A probe and its echo are one UDP datagram, of messageLen bytes in
// version 1 and messageLenV2 in version 2:
//
//	0..3   "MPTL"
//	4      version (1 or 2)
//	5      kind: kindProbe or kindEcho
//	6      flags: zero in a probe; in an echo flagHeldDown, flagReady
//	       (only with flagHeldDown) and flagSpeaksV2
//	7      zero
//	8..15  the prober's nonce, echoed unchanged
//	16..23 the probe's sequence number, echoed unchanged
//	24..31 version 2 only: the key (below)
//
// The nonce is a number a prober draws for each peer on each path: an echo
// counts only when it carries it, so a sender that does not see the probes
// to that peer on that path cannot keep a dead path alive with forged
// echoes, nor take a live one down with a forged flag.
//
// The key lets the receiver's datapath tell a peer's probes from forged
// ones before its socket reads them (a flood of probes forged with a
// peer's address would otherwise drown that peer's real probes and echoes
// in the socket's queue). It is the receiver's own nonce for the sender:
// in an echo the echoing node gives its nonce for the prober (the echo
// itself is proven by the prober's nonce, so a forger cannot teach a
// wrong key), and in a probe the prober gives back the key its peer's
// echoes taught it (zero until then). nic_ingress passes a probe whose key
// is the node's nonce for its sender; other probes from a peer's address
// (version 1, a key not learnt yet, or forged) share a small budget per
// peer (bpf/datapath.c, liveness_datagram).
//
// Versions: an agent answers a probe in the probe's version, setting
// flagSpeaksV2 in a version 1 echo; a prober sends version 1 probes to a
// peer until an echo says that peer speaks version 2. Agents of version 1
// alone (every release since the echo flags) ignore echo flags they do not
// know, not the echo, so they keep working beside this release (their
// probes spend the unproven budget).
const (
	messageLen   = 24
	messageLenV2 = 32
)

const (
	magic          = "MPTL"
	version1       = 1
	version2       = 2
	kindProbe byte = 1
	kindEcho  byte = 2

	// flagHeldDown: the node that echoes holds the prober's node Down on
	// the path (target.heard).
	flagHeldDown byte = 1
	// flagReady, with flagHeldDown: the node that echoes would let the
	// prober's node Up by its own rules, and waits only for the prober to
	// let it Up too (target.mayComeUp).
	flagReady byte = 2
	// flagSpeaksV2, in a version 1 echo: the node that echoes reads
	// version 2 probes.
	flagSpeaksV2 byte = 4
)

type message struct {
	kind  byte
	nonce uint64
	seq   uint64
	// heldDown (an echo's): the echoing node holds the prober Down;
	// ready, only with heldDown: it waits only for the prober.
	heldDown, ready bool
	// v2: the message is version 2, with key; speaksV2, in a version 1
	// echo: its sender reads version 2 (a version 2 message says so by
	// itself).
	v2, speaksV2 bool
	key          uint64
}

func (m message) marshal() []byte {
	n, v := messageLen, byte(version1)
	if m.v2 {
		n, v = messageLenV2, version2
	}
	b := make([]byte, n)
	copy(b, magic)
	b[4], b[5] = v, m.kind
	if m.kind == kindEcho {
		if m.heldDown {
			b[6] = flagHeldDown
			if m.ready {
				b[6] |= flagReady
			}
		}
		if m.speaksV2 && !m.v2 {
			b[6] |= flagSpeaksV2
		}
	}
	binary.BigEndian.PutUint64(b[8:], m.nonce)
	binary.BigEndian.PutUint64(b[16:], m.seq)
	if m.v2 {
		binary.BigEndian.PutUint64(b[24:], m.key)
	}
	return b
}

var errNotAMessage = errors.New("not a liveness message")

// parseMessage accepts what marshal writes, and echoes with flags it does
// not know (read as marshal would write the ones it knows).
func parseMessage(b []byte) (message, error) {
	if len(b) < messageLen || string(b[:4]) != magic || b[7] != 0 {
		return message{}, errNotAMessage
	}
	var m message
	switch {
	case b[4] == version1 && len(b) == messageLen:
	case b[4] == version2 && len(b) == messageLenV2:
		m.v2 = true
		m.key = binary.BigEndian.Uint64(b[24:])
	default:
		return message{}, errNotAMessage
	}
	flags := b[6]
	m.kind, m.nonce, m.seq = b[5], binary.BigEndian.Uint64(b[8:]), binary.BigEndian.Uint64(b[16:])
	switch {
	case m.kind == kindProbe && flags == 0:
	case m.kind == kindEcho:
		// Flags this release does not know are ignored: the next one
		// must not make this release count echoes lost, as flagHeldDown
		// did the release before it (and flagReady the one before
		// that).
		m.heldDown = flags&flagHeldDown != 0
		m.ready = m.heldDown && flags&flagReady != 0
		m.speaksV2 = !m.v2 && flags&flagSpeaksV2 != 0
	default:
		return message{}, errNotAMessage
	}
	return m, nil
}
