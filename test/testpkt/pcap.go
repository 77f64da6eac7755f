package testpkt

import (
	"encoding/binary"
	"os"
)

// WritePcap writes frames to path as a classic pcap file (microsecond
// timestamps, Ethernet link type), so an independent decoder such as tshark
// can read exactly the bytes a test fed to the datapath. Frame i gets the
// timestamp i seconds, so it is frame number i+1 in tshark.
func WritePcap(path string, frames [][]byte) error {
	const (
		magic        = 0xa1b2c3d4
		linkEthernet = 1
		snapLen      = 65535
	)
	b := binary.LittleEndian.AppendUint32(nil, magic)
	b = binary.LittleEndian.AppendUint16(b, 2) // version 2.4
	b = binary.LittleEndian.AppendUint16(b, 4)
	b = binary.LittleEndian.AppendUint32(b, 0) // timezone
	b = binary.LittleEndian.AppendUint32(b, 0) // sigfigs
	b = binary.LittleEndian.AppendUint32(b, snapLen)
	b = binary.LittleEndian.AppendUint32(b, linkEthernet)
	for i, f := range frames {
		b = binary.LittleEndian.AppendUint32(b, uint32(i)) // seconds
		b = binary.LittleEndian.AppendUint32(b, 0)         // microseconds
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	return os.WriteFile(path, b, 0o644)
}
