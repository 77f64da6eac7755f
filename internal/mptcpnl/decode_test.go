package mptcpnl

import (
	"encoding/binary"
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
