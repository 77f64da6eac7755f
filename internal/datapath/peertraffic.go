package datapath

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// SetPeerSlots tells pod_egress which peer node each pod address is of: a
// subflow's packet a selected pod sends to an address in one of the
// prefixes (a peer's pod CIDRs) records the time in the peer's slot,
// 1..limits.ProbedPeers, which PeerTraffic reads. The map is written whole
// (writePeerCIDRs); nil clears it.
func (d *Datapath) SetPeerSlots(slots map[netip.Prefix]uint32) error {
	want := map[datapathPeerCidrKey]uint32{}
	for prefix, slot := range slots {
		if slot == 0 || slot > limits.ProbedPeers {
			return fmt.Errorf("peer slots: %s has slot %d, want 1..%d", prefix, slot, limits.ProbedPeers)
		}
		k, err := peerCIDRKey(prefix)
		if err != nil {
			return fmt.Errorf("peer slots: %w", err)
		}
		want[k] = slot
	}
	return writePeerCIDRs(d.objs.PeerSlots, d.objs.PeerSlotsUsed, want)
}

// PeerTraffic reads, without a system call, when the node's pods last sent
// to each peer's pods (SetPeerSlots): the map is mapped into the agent's
// memory.
type PeerTraffic struct {
	mem *ebpf.Memory
}

// PeerTraffic maps the datapath's traffic times.
func (d *Datapath) PeerTraffic() (*PeerTraffic, error) {
	mem, err := d.objs.PeerTraffic.Memory()
	if err != nil {
		return nil, fmt.Errorf("mapping peer_traffic: %w", err)
	}
	return &PeerTraffic{mem: mem}, nil
}

// Since is how long ago the node's pods last sent to the pods of the peer
// in slot; false if they never did since the datapath was loaded, or the
// slot is out of range.
func (t *PeerTraffic) Since(slot uint32) (time.Duration, bool) {
	if slot == 0 || slot > limits.ProbedPeers {
		return 0, false
	}
	// Eight aligned bytes: one load on the architectures the agent
	// runs on, never half of the program's store.
	var b [8]byte
	if _, err := t.mem.ReadAt(b[:], int64(slot)*8); err != nil {
		return 0, false
	}
	at := binary.NativeEndian.Uint64(b[:])
	if at == 0 {
		return 0, false
	}
	now := ktimeNow()
	if at >= now {
		return 0, true
	}
	return time.Duration(now - at), true
}

// Forget clears slot's record: the peer given it now never had traffic.
func (t *PeerTraffic) Forget(slot uint32) {
	if slot == 0 || slot > limits.ProbedPeers {
		return
	}
	var zero [8]byte
	_, _ = t.mem.WriteAt(zero[:], int64(slot)*8)
}
