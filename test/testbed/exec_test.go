package testbed

import (
	"bytes"
	"context"
	"encoding/csv"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCommandRunsInNamespaceAndSeesPins checks that a command in a node namespace sees that namespace's interfaces
// in /sys (as "ip netns exec" gives) and the machine's bpffs at /sys/fs/bpf, so that what it makes in PinDir is
// visible to the test, and survives the command.
func TestCommandRunsInNamespaceAndSeesPins(t *testing.T) {
	b := NewForTest(t, Config{Nodes: 1, NICs: 2})
	node := b.Node(1)
	out, err := b.Command(node.NetNS, "ls", "/sys/class/net").CombinedOutput()
	Must(t, err)
	if got := strings.Fields(string(out)); !strings.Contains(string(out), "nic2") || len(got) != 3 {
		t.Errorf("/sys/class/net in %s lists %v, want lo nic1 nic2", node.NetNS, got)
	}
	// bpffs takes directories as it takes pins: one made inside the node's
	// namespace is made on the machine's bpffs, where the agent's pins go.
	pin := filepath.Join(b.PinDir(node), "probe_dir")
	out, err = b.Command(node.NetNS, "mkdir", pin).CombinedOutput()
	if err != nil {
		t.Fatalf("mkdir in bpffs from inside %s: %v\n%s", node.NetNS, err, out)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(pin, &fs); err != nil {
		t.Fatalf("directory made in bpffs inside the node namespace is not visible outside: %v", err)
	}
	if fs.Type != unix.BPF_FS_MAGIC {
		t.Fatalf("%s is on a filesystem of type %#x, want bpffs (%#x)", pin, fs.Type, unix.BPF_FS_MAGIC)
	}
}

func TestSamplerRecordsEveryNIC(t *testing.T) {
	b := NewForTest(t, Config{Nodes: 2, NICs: 2, PodsPerNode: 1})
	bin := BuildTraffic(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := b.StartSampler(50 * time.Millisecond)
	Must(t, err)
	srv, err := b.StartTrafficServer(ctx, bin, b.Pod(2, 1), 5201, false)
	Must(t, err)
	_, err = b.Send(ctx, bin, b.Pod(1, 1), srv.Addr, false, "-duration", "500ms")
	Must(t, err)
	rows, err := s.Stop()
	Must(t, err)
	if len(rows) < 4*8 {
		t.Fatalf("%d samples in about 0.5 s at 50 ms for 4 NICs", len(rows))
	}
	last := map[[2]int]Sample{}
	for _, r := range rows {
		last[[2]int{r.Node, r.NIC}] = r
	}
	if len(last) != 4 || last[[2]int{1, 1}].TxBytes < 1<<20 || last[[2]int{2, 1}].RxBytes < 1<<20 {
		t.Errorf("last samples %v: want 4 NICs and node1 nic1 -> node2 nic1 carrying the transfer", last)
	}
	var buf bytes.Buffer
	Must(t, s.WriteCSV(&buf))
	recs, err := csv.NewReader(&buf).ReadAll()
	Must(t, err)
	if len(recs) != len(rows)+1 || strings.Join(recs[0], ",") != "t_s,node,nic,rx_bytes,tx_bytes" {
		t.Errorf("CSV has %d records (want %d) and header %v", len(recs), len(rows)+1, recs[0])
	}
}
