package testbed

import (
	"fmt"

	"github.com/vishvananda/netlink"
)

// StripMPCapable makes the wire of NIC k of node i a middlebox that strips
// MPTCP's MP_CAPABLE option from the SYN-ACKs leaving node i over it
// (bpf/test/strip_mp_capable.c): a client then sees a server that does not speak
// MPTCP, and the server a connection that falls back to TCP after it
// negotiated MPTCP. remove takes the middlebox away again; stripped reads
// how many SYN-ACKs it changed.
func (b *Bed) StripMPCapable(i, k int) (stripped func() (uint64, error), remove func() error, err error) {
	var objs stripMPCapableObjects
	if err := loadStripMPCapableObjects(&objs, nil); err != nil {
		return nil, nil, fmt.Errorf("loading the MP_CAPABLE stripper: %w", err)
	}
	c := b.Node(i).NIC(k)
	name := fmt.Sprintf("testbed-strip-%d-%d", i, k)
	if err := attachWireFilter(c, objs.StripMpCapable, stripPriority, 3, name, c.WireNodeSide); err != nil {
		objs.Close()
		return nil, nil, err
	}
	stripped = func() (uint64, error) {
		var n uint64
		err := objs.Stripped.Get(&n)
		return n, err
	}
	remove = func() error {
		defer objs.Close()
		h, err := nsHandle(c.WireNS)
		if err != nil {
			return err
		}
		defer h.Close()
		l, err := h.LinkByName(c.WireNodeSide)
		if err != nil {
			return err
		}
		return h.FilterDel(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{
			LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS, Handle: 3, Priority: stripPriority,
		}})
	}
	return stripped, remove, nil
}
