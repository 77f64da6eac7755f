package mptcpnl

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The path manager's events say what changed; sock_diag says what is. A
// path manager that starts after its pod's connections did (an agent that
// was restarted, events the kernel dropped) reads the subflows there are
// from the TCP sockets' MPTCP ULP info, as ss -tiM shows it
// (include/uapi/linux/inet_diag.h, mptcp.h).

// SubflowFlags are a subflow's MPTCP_SUBFLOW_FLAG_* bits.
type SubflowFlags uint32

// Subflow flags the agent reads.
const (
	// SubflowCapableLocal: this end sent the connection's MP_CAPABLE SYN
	// on this subflow (the connection's first, opened here).
	SubflowCapableLocal SubflowFlags = 1 << 1
	// SubflowJoinLocal: this end opened the subflow with an MP_JOIN.
	SubflowJoinLocal SubflowFlags = 1 << 3
	// SubflowBackupLocal: this end asks the peer to treat the subflow as a
	// backup (the B bit of its MP_JOIN or its last MP_PRIO).
	SubflowBackupLocal SubflowFlags = 1 << 5
)

// Subflow is an established MPTCP subflow of a namespace.
type Subflow struct {
	Local, Remote netip.AddrPort
	// Token is the connection's token on this end: the one its path
	// manager events and commands carry.
	Token   uint32
	LocalID uint8
	Flags   SubflowFlags
}

// sock_diag constants the header packages do not all spell.
const (
	sockDiagByFamily = 20 // SOCK_DIAG_BY_FAMILY
	diagExtInfo      = 2  // INET_DIAG_INFO: asks for tcp_info and the ULP's
	diagULPInfo      = 19 // INET_DIAG_ULP_INFO
	ulpInfoMPTCP     = 3  // INET_ULP_INFO_MPTCP
	subflowTokenLoc  = 2  // MPTCP_SUBFLOW_ATTR_TOKEN_LOC
	subflowFlags     = 8  // MPTCP_SUBFLOW_ATTR_FLAGS
	subflowIDLoc     = 10 // MPTCP_SUBFLOW_ATTR_ID_LOC
	diagReqLen       = 56 // struct inet_diag_req_v2
	diagMsgLen       = 72 // struct inet_diag_msg
	tcpEstablished   = 1  // TCP_ESTABLISHED, a bit of idiag_states
)

// ListSubflows lists the established MPTCP subflows of the network namespace
// with file descriptor netnsFD (0: the caller's), of both address families.
// TCP sockets that are not subflows are left out.
func ListSubflows(netnsFD int) ([]Subflow, error) {
	c, err := netlink.Dial(unix.NETLINK_SOCK_DIAG, &netlink.Config{NetNS: netnsFD})
	if err != nil {
		return nil, fmt.Errorf("sock_diag: %w", err)
	}
	defer c.Close()
	var out []Subflow
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		req := make([]byte, diagReqLen)
		req[0], req[1], req[2] = family, unix.IPPROTO_TCP, 1<<(diagExtInfo-1)
		binary.NativeEndian.PutUint32(req[4:8], 1<<tcpEstablished)
		msgs, err := c.Execute(netlink.Message{
			Header: netlink.Header{Type: sockDiagByFamily, Flags: netlink.Request | netlink.Dump},
			Data:   req,
		})
		if err != nil {
			return nil, fmt.Errorf("listing TCP sockets: %w", err)
		}
		for _, m := range msgs {
			sf, ok, err := decodeSubflow(m.Data)
			if err != nil {
				return nil, err
			}
			if ok {
				out = append(out, sf)
			}
		}
	}
	return out, nil
}

// decodeSubflow decodes one inet_diag_msg; ok is false for a TCP socket
// that is not an MPTCP subflow.
func decodeSubflow(b []byte) (sf Subflow, ok bool, err error) {
	if len(b) < diagMsgLen {
		return sf, false, fmt.Errorf("sock_diag: a message of %d bytes", len(b))
	}
	family := b[0]
	addr := func(raw []byte) netip.Addr {
		if family == unix.AF_INET {
			return netip.AddrFrom4([4]byte(raw[:4]))
		}
		return netip.AddrFrom16([16]byte(raw[:16])).Unmap()
	}
	// struct inet_diag_sockid starts at 4: ports in network byte order,
	// then source and destination in 16 bytes each.
	sf.Local = netip.AddrPortFrom(addr(b[8:24]), binary.BigEndian.Uint16(b[4:6]))
	sf.Remote = netip.AddrPortFrom(addr(b[24:40]), binary.BigEndian.Uint16(b[6:8]))
	ad, err := netlink.NewAttributeDecoder(b[diagMsgLen:])
	if err != nil {
		return sf, false, fmt.Errorf("sock_diag attributes: %w", err)
	}
	for ad.Next() {
		if ad.Type() != diagULPInfo {
			continue
		}
		ad.Nested(func(ulp *netlink.AttributeDecoder) error {
			for ulp.Next() {
				if ulp.Type() != ulpInfoMPTCP {
					continue
				}
				ok = true
				ulp.Nested(func(mp *netlink.AttributeDecoder) error {
					for mp.Next() {
						switch mp.Type() {
						case subflowTokenLoc:
							sf.Token = mp.Uint32()
						case subflowFlags:
							sf.Flags = SubflowFlags(mp.Uint32())
						case subflowIDLoc:
							sf.LocalID = mp.Uint8()
						}
					}
					return mp.Err()
				})
			}
			return ulp.Err()
		})
	}
	if err := ad.Err(); err != nil {
		return sf, false, fmt.Errorf("sock_diag MPTCP info: %w", err)
	}
	return sf, ok, nil
}
