package testbed

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// leftovers lists what a bed with this prefix could leave behind: namespaces, processes inside them, its pin
// directory.
func leftovers(t *testing.T, prefix string) []string {
	t.Helper()
	names, err := listNetns()
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix+"-") {
			left = append(left, "netns "+n)
			for _, pid := range netnsPIDs(n) {
				left = append(left, fmt.Sprintf("process %d in %s", pid, n))
			}
		}
	}
	if _, err := os.Stat(filepath.Join(PinRoot, prefix)); err == nil {
		left = append(left, "pin dir "+filepath.Join(PinRoot, prefix))
	}
	return left
}

func TestUpDownLeavesNothing(t *testing.T) {
	for _, cfg := range []Config{
		{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit"},
		{Nodes: 2, NICs: 4, PodsPerNode: 2},
	} {
		t.Run(fmt.Sprintf("%dx%d", cfg.Nodes, cfg.NICs), func(t *testing.T) {
			RequireRoot(t)
			RequireTools(t, BedTools...)
			start := time.Now()
			b, err := Up(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("Up took %v", time.Since(start))
			wantNS := cfg.Nodes + cfg.NICs + cfg.Nodes*cfg.NICs + cfg.Nodes*cfg.PodsPerNode
			if got := len(leftovers(t, b.Name)); got != wantNS {
				b.Down()
				t.Fatalf("bed %s has %d namespaces, want %d", b.Name, got, wantNS)
			}
			// Things Down must clean up: a pinned directory, a long-running process in a pod and one in a node.
			pin := b.PinDir(b.Node(1))
			if _, err := os.Stat(pin); err != nil {
				t.Errorf("pin dir: %v", err)
			}
			if _, err := b.Start(b.Pod(1, 1).NetNS, "sleep", "600"); err != nil {
				t.Fatal(err)
			}
			// This one ignores SIGTERM, and its child outlives it: Down must escalate and sweep.
			stubborn, err := b.Start(b.Node(2).NetNS, "sh", "-c", "trap '' TERM; echo ready; sleep 600")
			if err != nil {
				t.Fatal(err)
			}
			if err := stubborn.WaitOutput(context.Background(), "ready"); err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			if err := b.Down(); err != nil {
				t.Fatal(err)
			}
			t.Logf("Down took %v", time.Since(start))
			if left := leftovers(t, b.Name); len(left) > 0 {
				t.Fatalf("left behind after Down: %v", left)
			}
		})
	}
}

// On a bed whose fabrics are shared LANs, each node reaches the others' NIC k directly on fabric k (no router
// between, as flannel's host-gw needs), and the fabrics route no pod CIDR.
func TestSharedLANFabricsAreOneSegmentEach(t *testing.T) {
	RequireRoot(t)
	RequireTools(t, BedTools...)
	b := NewForTest(t, Config{Nodes: 2, NICs: 2, SharedLAN: true})
	n1, n2 := b.Node(1), b.Node(2)
	for _, k := range []int{1, 2} {
		peer := n2.NIC(k).Addr.Addr().String()
		if out, err := b.Command(n1.NetNS, "ip", "route", "get", peer).CombinedOutput(); err != nil ||
			!strings.Contains(string(out), "dev nic"+fmt.Sprint(k)) || strings.Contains(string(out), " via ") {
			t.Errorf("node 1's route to node 2's NIC %d (%s): %s (%v), want it on nic%d's link", k, peer, out, err, k)
		}
		// And a connection from node 1 to node 2 crosses it.
		var ln net.Listener
		if err := netnsutil.Do("/var/run/netns/"+n2.NetNS, func() (err error) {
			ln, err = net.Listen("tcp", net.JoinHostPort(peer, "0"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		go func() {
			if c, err := ln.Accept(); err == nil {
				c.Close()
			}
		}()
		if err := netnsutil.Do("/var/run/netns/"+n1.NetNS, func() error {
			c, err := net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second)
			if err == nil {
				c.Close()
			}
			return err
		}); err != nil {
			t.Errorf("node 1 cannot connect to node 2 over nic%d: %v", k, err)
		}
		ln.Close()
		if out, err := b.Command(b.Fabrics[k-1], "ip", "route", "get", n2.PodCIDR.Addr().Next().String()).CombinedOutput(); err == nil {
			t.Errorf("fabric %d routes node 2's pod CIDR: %s", k, out)
		}
	}
}

// TestCleanupAfterFailure runs a test that fails midway (in a child test process, so that this test can observe
// it from outside) and checks that the bed's t.Cleanup removed everything anyway.
func TestCleanupAfterFailure(t *testing.T) {
	RequireRoot(t)
	RequireTools(t, BedTools...)
	nameFile := filepath.Join(t.TempDir(), "name")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperFailsMidway$", "-test.v")
	cmd.Env = append(os.Environ(), "TESTBED_HELPER_NAME_FILE="+nameFile)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the helper test should have failed:\n%s", out)
	}
	if !strings.Contains(string(out), "induced failure") {
		t.Fatalf("the helper test failed for another reason:\n%s", out)
	}
	name, rerr := os.ReadFile(nameFile)
	if rerr != nil {
		t.Fatalf("helper did not record its bed: %v\n%s", rerr, out)
	}
	if left := leftovers(t, string(name)); len(left) > 0 {
		t.Fatalf("left behind after a test failed midway: %v", left)
	}
}

// TestHelperFailsMidway is run by TestCleanupAfterFailure only.
func TestHelperFailsMidway(t *testing.T) {
	nameFile := os.Getenv("TESTBED_HELPER_NAME_FILE")
	if nameFile == "" {
		t.Skip("helper of TestCleanupAfterFailure")
	}
	b := NewForTest(t, Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	Must(t, os.WriteFile(nameFile, []byte(b.Name), 0o644))
	b.PinDir(b.Node(1))
	Must(t, b.SetLoss(1, 1, 10))
	_, err := b.Start(b.Pod(1, 1).NetNS, "sleep", "600")
	Must(t, err)
	t.Fatal("induced failure: Down must still run")
}

func TestSweepRemovesStaleBed(t *testing.T) {
	RequireRoot(t)
	RequireTools(t, BedTools...)
	b, err := Up(context.Background(), Config{Nodes: 1, NICs: 1, PodsPerNode: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Down()
	// A crashed run: its owner process is gone.
	if err := os.WriteFile(filepath.Join(stateDir, b.Name+".owner"), []byte("999999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Start(b.Pod(1, 1).NetNS, "sleep", "600"); err != nil {
		t.Fatal(err)
	}
	if err := SweepStale(); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(t, b.Name); len(left) > 0 {
		t.Fatalf("SweepStale left: %v", left)
	}
}

func TestSweepKeepsLiveBeds(t *testing.T) {
	b := NewForTest(t, Config{Nodes: 1, NICs: 1})
	if err := SweepStale(); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(t, b.Name); len(left) != 3 {
		t.Fatalf("SweepStale touched a live bed: %v", left)
	}
}
