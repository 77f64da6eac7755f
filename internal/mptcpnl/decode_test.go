package mptcpnl

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
)

// eventMessage encodes an event as the kernel does.
func eventMessage(t testing.TB, ev Event) genetlink.Message {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(evAttrToken, ev.Token)
	ae.Uint8(evAttrLocID, ev.LocalID)
	ae.Bytes(evAttrSaddr4, ev.Local.Addr().AsSlice())
	ae.Bytes(evAttrDaddr4, ev.Remote.Addr().AsSlice())
	ae.Bytes(evAttrSport, binary.BigEndian.AppendUint16(nil, ev.Local.Port()))
	ae.Bytes(evAttrDport, binary.BigEndian.AppendUint16(nil, ev.Remote.Port()))
	ae.Uint8(evAttrBackup, 1)
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return genetlink.Message{Header: genetlink.Header{Command: uint8(ev.Type)}, Data: b}
}

func TestDecodeEventReadsTheKernelsEncoding(t *testing.T) {
	want := Event{Type: EventType(2), Token: 0xdeadbeef, LocalID: 3, Backup: true,
		Local: netip.MustParseAddrPort("10.244.1.11:40000"), Remote: netip.MustParseAddrPort("10.244.2.11:5201")}
	got, err := decodeEvent(eventMessage(t, want))
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("decoded %+v, want %+v", got, want)
	}
}

// Attributes of the wrong length, as a buggy or hostile sender on the
// family could send, are errors, never a panic.
func TestDecodeEventRefusesShortAttributes(t *testing.T) {
	for name, attr := range map[string]struct {
		typ  uint16
		data []byte
	}{
		"one-byte port":           {evAttrSport, []byte{1}},
		"empty port":              {evAttrDport, nil},
		"three-byte IPv4 address": {evAttrSaddr4, []byte{10, 0, 0}},
		"IPv4 length for IPv6":    {evAttrDaddr6, []byte{10, 0, 0, 1}},
		"two-byte token":          {evAttrToken, []byte{1, 2}},
	} {
		ae := netlink.NewAttributeEncoder()
		ae.Bytes(attr.typ, attr.data)
		b, err := ae.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeEvent(genetlink.Message{Data: b}); err == nil {
			t.Errorf("%s: decoded without an error", name)
		}
	}
}

// Whatever arrives on the socket, decoding returns: no panic ends the
// agent's path manager.
func FuzzDecodeEvent(f *testing.F) {
	f.Add(uint8(2), eventMessage(f, Event{Type: 2, Token: 1, Local: netip.MustParseAddrPort("1.2.3.4:5"), Remote: netip.MustParseAddrPort("5.6.7.8:9")}).Data)
	f.Add(uint8(0), []byte{4, 0, 9, 0})
	f.Add(uint8(7), []byte{5, 0, 5, 0, 1})
	f.Fuzz(func(t *testing.T, cmd uint8, data []byte) {
		_, _ = decodeEvent(genetlink.Message{Header: genetlink.Header{Command: cmd}, Data: data})
	})
}

// nlMsg is one netlink message of type typ carrying payload, padded.
func nlMsg(typ uint16, payload []byte) []byte {
	b := make([]byte, 16, 16+len(payload)+3)
	binary.NativeEndian.PutUint32(b[0:], uint32(16+len(payload)))
	binary.NativeEndian.PutUint16(b[4:], typ)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// What genetlink would fail on (an NLMSG_ERROR, a generic netlink header cut
// short, a length past the datagram) is ErrMalformed and costs only itself:
// the events around it in the same datagram are decoded.
func TestDecodeDatagramSkipsWhatIsNotAnEvent(t *testing.T) {
	const family = 0x1c
	c := &Conn{family: genetlink.Family{ID: family}}
	ev := Event{Type: EventEstablished, Token: 7, Backup: true,
		Local: netip.MustParseAddrPort("10.0.0.1:40000"), Remote: netip.MustParseAddrPort("10.0.0.2:5201")}
	m := eventMessage(t, ev)
	good, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	cut := nlMsg(family, []byte{2, 1})
	cut = append(cut[:len(cut):len(cut)], 0xff, 0xff, 0, 0) // and a length past the end
	binary.NativeEndian.PutUint32(cut[20:], 64)
	for name, bad := range map[string][]byte{
		"NLMSG_ERROR":       nlMsg(2, []byte{0xff, 0xff, 0xff, 0xff}),
		"short genl header": nlMsg(family, []byte{2, 1}),
		"another family":    nlMsg(family+1, good),
		"bad length":        cut,
		"trailing bytes":    {1, 2, 3},
	} {
		var dgram []byte
		dgram = append(dgram, nlMsg(family, good)...)
		dgram = append(dgram, bad...)
		evs, err := c.decodeDatagram(dgram)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: error %v, want ErrMalformed", name, err)
		}
		if len(evs) != 1 || evs[0] != ev {
			t.Errorf("%s: events %+v, want the good one %+v", name, evs, ev)
		}
	}
}

// Whatever a sock_diag reply holds, decoding a subflow returns.
func FuzzDecodeSubflow(f *testing.F) {
	msg := make([]byte, diagMsgLen)
	msg[0] = 2 // AF_INET
	ulp := []byte{
		28, 0, diagULPInfo, 0x80, // INET_DIAG_ULP_INFO, nested
		24, 0, ulpInfoMPTCP, 0x80, // INET_ULP_INFO_MPTCP, nested
		8, 0, subflowTokenLoc, 0, 1, 2, 3, 4,
		8, 0, subflowFlags, 0, 0x28, 0, 0, 0,
	}
	f.Add(append(msg, ulp...))
	f.Add(msg)
	f.Add([]byte{10, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _ = decodeSubflow(b)
	})
}
