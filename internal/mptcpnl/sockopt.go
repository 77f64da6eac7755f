package mptcpnl

import (
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	solMPTCP  = 284 // SOL_MPTCP
	mptcpInfo = 1   // MPTCP_INFO
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
	raw, err := c.SyscallConn()
	if err != nil {
		return Info{}, err
	}
	var buf [256]byte
	size := uint32(len(buf))
	var serr error
	err = raw.Control(func(fd uintptr) {
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, solMPTCP, mptcpInfo,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			serr = errno
		}
	})
	if err != nil {
		return Info{}, err
	}
	if serr != nil {
		return Info{}, fmt.Errorf("getsockopt MPTCP_INFO: %w", serr)
	}
	return Info{Subflows: buf[0], AddAddrSignal: buf[1], AddAddrAccepted: buf[2], SubflowsMax: buf[3]}, nil
}
