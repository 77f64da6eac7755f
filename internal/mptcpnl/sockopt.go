package mptcpnl

import (
	"encoding/binary"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	solMPTCP     = 284 // SOL_MPTCP
	mptcpInfo    = 1   // MPTCP_INFO
	mptcpTCPInfo = 2   // MPTCP_TCPINFO
)

// Info is the head of struct mptcp_info: what a socket's own kernel says
// about its connection.
type Info struct {
	Subflows        uint8 // additional subflows (joins) currently open
	AddAddrSignal   uint8
	AddAddrAccepted uint8
	SubflowsMax     uint8
}

// SocketInfo reads MPTCP_INFO from an MPTCP socket.
func SocketInfo(c syscall.Conn) (Info, error) {
	var buf [256]byte
	if err := getsockopt(c, mptcpInfo, buf[:]); err != nil {
		return Info{}, fmt.Errorf("getsockopt MPTCP_INFO: %w", err)
	}
	return Info{Subflows: buf[0], AddAddrSignal: buf[1], AddAddrAccepted: buf[2], SubflowsMax: buf[3]}, nil
}

// SubflowTCP is what a subflow's struct tcp_info says of its handshake.
type SubflowTCP struct {
	// Established: the subflow's TCP state is ESTABLISHED.
	Established bool
	// SegmentsIn is tcpi_segs_in: the segments the subflow received, its
	// SYN-ACK included.
	SegmentsIn uint32
}

// tcp_info fields SubflowTCPInfo reads (include/uapi/linux/tcp.h).
const (
	tcpInfoSegsIn = 140 // offset of tcpi_segs_in
	tcpInfoLen    = 144 // through tcpi_segs_in
)

// SubflowTCPInfo reads the tcp_info of each of an MPTCP socket's subflows
// (MPTCP_TCPINFO, Linux 5.16 and later), at most 8 of them.
func SubflowTCPInfo(c syscall.Conn) ([]SubflowTCP, error) {
	const maxSubflows, headLen = 8, 16
	// struct mptcp_subflow_data, then one tcp_info of size_user bytes per
	// subflow.
	buf := make([]byte, headLen+maxSubflows*tcpInfoLen)
	binary.NativeEndian.PutUint32(buf[0:4], headLen)
	binary.NativeEndian.PutUint32(buf[12:16], tcpInfoLen)
	if err := getsockopt(c, mptcpTCPInfo, buf); err != nil {
		return nil, fmt.Errorf("getsockopt MPTCP_TCPINFO: %w", err)
	}
	// The kernel fills num_subflows with them all and copies as many as
	// fit, each in size_user bytes (the smaller of ours and its own).
	num := binary.NativeEndian.Uint32(buf[4:8])
	each := binary.NativeEndian.Uint32(buf[12:16])
	if each < tcpInfoLen {
		return nil, fmt.Errorf("getsockopt MPTCP_TCPINFO: a tcp_info of %d bytes has no tcpi_segs_in", each)
	}
	out := []SubflowTCP{}
	for i := range min(num, maxSubflows) {
		info := buf[headLen+i*each : headLen+(i+1)*each]
		out = append(out, SubflowTCP{
			Established: info[0] == tcpEstablished,
			SegmentsIn:  binary.NativeEndian.Uint32(info[tcpInfoSegsIn:]),
		})
	}
	return out, nil
}

// getsockopt reads the SOL_MPTCP option opt of c's socket into buf, which
// also carries what the option reads from the caller.
func getsockopt(c syscall.Conn, opt uintptr, buf []byte) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	size := uint32(len(buf))
	var serr error
	if err := raw.Control(func(fd uintptr) {
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, solMPTCP, opt,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			serr = errno
		}
	}); err != nil {
		return err
	}
	return serr
}
