package testbed

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// CorruptSegment makes the wire of NIC k of node i flip one payload byte
// (the 101st) of the nth IPv4 TCP segment with at least 1000 bytes of
// payload that leaves node i over it, without touching its checksum: the
// corruption a broken middlebox, NIC or datapath program would cause.
// Between namespaces the kernel trusts checksums it has not computed yet
// (CHECKSUM_PARTIAL), so nothing below MPTCP notices; this is how the
// tests prove that a changed byte fails a transfer, and what MPTCP's DSS
// checksums (net.mptcp.checksum_enabled) do about it. The filter stays
// until the bed goes down.
func (b *Bed) CorruptSegment(i, k int, nth uint32) error {
	prog, err := corruptProgram(nth)
	if err != nil {
		return err
	}
	defer prog.Close() // the filter holds its own reference
	c := b.Node(i).NIC(k)
	return attachWireFilter(c, prog, corruptPriority, 2, fmt.Sprintf("testbed-corrupt-%d", nth), c.WireNodeSide)
}

// corruptProgram builds the filter of CorruptSegment. It counts segments
// in a one-slot array map the program holds.
func corruptProgram(nth uint32) (*ebpf.Program, error) {
	count, err := ebpf.NewMap(&ebpf.MapSpec{Name: "testbed_corrupt", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		return nil, err
	}
	defer count.Close() // the program holds its own reference
	const (
		ethLen      = 14
		minPayload  = 1000
		flipAt      = 100
		tcActUnspec = -1
	)
	// loadByte reads into R0 the packet byte at the offset that setR2
	// puts in R2, or passes the packet when it cannot.
	loadByte := func(setR2 ...asm.Instruction) asm.Instructions {
		insns := asm.Instructions{asm.Mov.Reg(asm.R1, asm.R6)}
		insns = append(insns, setR2...)
		return append(insns,
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -8),
			asm.Mov.Imm(asm.R4, 1),
			asm.FnSkbLoadBytes.Call(),
			asm.JNE.Imm(asm.R0, 0, "pass"),
			asm.LoadMem(asm.R0, asm.RFP, -8, asm.Byte),
		)
	}
	var insns asm.Instructions
	insns = append(insns,
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word), // skb->len
		asm.JLT.Imm(asm.R2, ethLen+20+20+minPayload, "pass"),
		asm.LoadMem(asm.R2, asm.R6, 16, asm.Word), // skb->protocol, network order
		asm.JNE.Imm(asm.R2, 0x0008, "pass"),       // ETH_P_IP
	)
	insns = append(insns, loadByte(asm.Mov.Imm(asm.R2, ethLen))...) // version and IHL
	insns = append(insns,
		asm.And.Imm(asm.R0, 0x0f),
		asm.LSh.Imm(asm.R0, 2),
		asm.Mov.Reg(asm.R7, asm.R0), // IP header length
	)
	insns = append(insns, loadByte(asm.Mov.Imm(asm.R2, ethLen+9))...) // protocol
	insns = append(insns, asm.JNE.Imm(asm.R0, unix.IPPROTO_TCP, "pass"))
	// TCP's data offset is the high nibble of byte 12 of its header.
	insns = append(insns, loadByte(asm.Mov.Reg(asm.R2, asm.R7), asm.Add.Imm(asm.R2, ethLen+12))...)
	insns = append(insns,
		asm.RSh.Imm(asm.R0, 4),
		asm.LSh.Imm(asm.R0, 2),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.Add.Reg(asm.R8, asm.R7),
		asm.Add.Imm(asm.R8, ethLen), // payload offset
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word),
		asm.Sub.Reg(asm.R2, asm.R8),
		asm.JLT.Imm(asm.R2, minPayload, "pass"),
		// Count the segment; act on the nth only.
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, count.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.Word),
		asm.JNE.Imm(asm.R1, int32(nth), "pass"),
	)
	insns = append(insns, loadByte(asm.Mov.Reg(asm.R2, asm.R8), asm.Add.Imm(asm.R2, flipAt))...)
	insns = append(insns,
		asm.Xor.Imm(asm.R0, 0xff),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.Byte),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R2, asm.R8),
		asm.Add.Imm(asm.R2, flipAt),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -8),
		asm.Mov.Imm(asm.R4, 1),
		asm.Mov.Imm(asm.R5, 0), // no checksum update: that is the point
		asm.FnSkbStoreBytes.Call(),
		asm.Mov.Imm(asm.R0, tcActUnspec).WithSymbol("pass"),
		asm.Return(),
	)
	return ebpf.NewProgram(&ebpf.ProgramSpec{Name: "testbed_corrupt", Type: ebpf.SchedCLS, Instructions: insns, License: "GPL"})
}

// CopyOnWires makes every wire copy the data of every packet that crosses
// it into memory of its own (bpf_skb_pull_data over the whole packet), as a
// physical link does. Between namespaces a packet's pages are otherwise
// shared from the sender's socket to the receiver's: what the receiving
// application reads is then memory the sending kernel may still own. With
// copies, a change that only shared pages allow disappears; a change the
// receiver makes does not.
func (b *Bed) CopyOnWires() error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "testbed_copy",
		Type: ebpf.SchedCLS,
		Instructions: asm.Instructions{
			asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // skb->len
			asm.FnSkbPullData.Call(),
			asm.Mov.Imm(asm.R0, -1), // TC_ACT_UNSPEC: the next filter decides
			asm.Return(),
		},
		License: "GPL",
	})
	if err != nil {
		return err
	}
	defer prog.Close() // the filters hold their own references
	for _, n := range b.Nodes {
		for _, c := range n.NICs {
			if err := attachWireFilter(c, prog, copyPriority, 3, "testbed-copy", c.WireNodeSide, c.WireFabricSide); err != nil {
				return err
			}
		}
	}
	return nil
}

// attachWireFilter puts prog on the clsact ingress of the wire's devs.
func attachWireFilter(c NIC, prog *ebpf.Program, prio uint16, handle uint32, name string, devs ...string) error {
	h, err := nsHandle(c.WireNS)
	if err != nil {
		return err
	}
	defer h.Close()
	for _, dev := range devs {
		l, err := h.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("%s in %s: %w", dev, c.WireNS, err)
		}
		f := &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{
				LinkIndex: l.Attrs().Index,
				Parent:    netlink.HANDLE_MIN_INGRESS,
				Handle:    handle,
				Protocol:  unix.ETH_P_ALL,
				Priority:  prio,
			},
			Name:         name,
			Fd:           prog.FD(),
			DirectAction: true,
		}
		if err := h.FilterReplace(f); err != nil {
			return fmt.Errorf("%s filter on %s/%s: %w", name, c.WireNS, dev, err)
		}
	}
	return nil
}
