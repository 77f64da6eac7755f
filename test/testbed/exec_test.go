package testbed

import (
	"bytes"
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCommandRunsInNamespaceAndSeesPins checks that a command in a node namespace sees that namespace's interfaces
// in /sys (as "ip netns exec" gives) and the machine's bpffs at /sys/fs/bpf, so that an object it pins in PinDir is
// visible to the test, and survives the command.
func TestCommandRunsInNamespaceAndSeesPins(t *testing.T) {
	RequireTools(t, "bpftool")
	b := NewForTest(t, Config{Nodes: 1, NICs: 2})
	node := b.Node(1)
	out, err := b.Command(node.NetNS, "ls", "/sys/class/net").CombinedOutput()
	Must(t, err)
	if got := strings.Fields(string(out)); !strings.Contains(string(out), "nic2") || len(got) != 3 {
		t.Errorf("/sys/class/net in %s lists %v, want lo nic1 nic2", node.NetNS, got)
	}
	pin := filepath.Join(b.PinDir(node), "probe_map")
	out, err = b.Command(node.NetNS, "bpftool", "map", "create", pin, "type", "array", "key", "4", "value", "4",
		"entries", "1", "name", "probe_map").CombinedOutput()
	if err != nil {
		t.Fatalf("pinning from inside %s: %v\n%s", node.NetNS, err, out)
	}
	if _, err := os.Stat(pin); err != nil {
		t.Fatalf("pin made inside the node namespace is not visible outside: %v", err)
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
