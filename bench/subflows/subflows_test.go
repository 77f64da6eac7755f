// Package subflows measures the two ways the agent can give a pod's MPTCP
// connections their extra subflows (docs/subflows.md): the agent as the
// client pod's userspace path manager, or servers announcing extra ports to
// the clients' in-kernel path managers.
//
//	go test -run '^$' -bench . -benchtime 20x ./bench/subflows/
package subflows

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// BenchmarkSubflowCreation opens b.N short connections one after another and
// reports, from captures on node 1's NICs decoded by tshark, how long after a
// connection's first SYN its last join's SYN left (join-ms, median and max),
// and the goodput of one bulk transfer (Mbit/s).
func BenchmarkSubflowCreation(b *testing.B) {
	testbed.RequireTools(b, testbed.CaptureTools...)
	dir := b.TempDir()
	bins, err := framework.BuildBinaries(dir)
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []mptcpv1alpha1.SubflowCreation{mptcpv1alpha1.SubflowCreationUserspace, mptcpv1alpha1.SubflowCreationSignal} {
		b.Run(string(mode), func(b *testing.B) {
			bed := testbed.NewForTest(b, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit"})
			ctx := b.Context()
			agents, err := framework.StartAgentsWith(ctx, bed, bins.Agent, func(n *testbed.Node) mptcpv1alpha1.CompiledRule {
				if mode == mptcpv1alpha1.SubflowCreationSignal && n.Index == 2 {
					return mptcpv1alpha1.CompiledRule{SubflowCreation: mode, SignalPorts: []int32{6002}}
				}
				return mptcpv1alpha1.CompiledRule{SubflowCreation: mode}
			})
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				for _, a := range agents {
					_ = a.Uninstall(ctx)
				}
			}()
			client, server := bed.Pod(1, 1), bed.Pod(2, 1)
			srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, 5201, true)
			if err != nil {
				b.Fatal(err)
			}
			to := netip.AddrPortFrom(server.Addr, 5201)

			caps, err := bed.StartCaptures("tcp")
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := bed.Send(ctx, bins.Traffic, client, to, true, "-bytes", "1000000"); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			files, err := caps.Stop()
			if err != nil {
				b.Fatal(err)
			}
			delays, joins, err := joinDelays(files, client.Node.Index)
			if err != nil {
				b.Fatal(err)
			}
			if len(delays) != b.N {
				b.Fatalf("captures show %d connections with joins, want %d (joins per connection: %v)", len(delays), b.N, joins)
			}
			slices.Sort(delays)
			b.ReportMetric(float64(delays[len(delays)/2].Microseconds())/1000, "join-ms-median")
			b.ReportMetric(float64(delays[len(delays)-1].Microseconds())/1000, "join-ms-max")

			m, err := framework.Transfer(ctx, bed, framework.CompareOptions{Binaries: bins, Duration: 8 * time.Second, Warmup: 2 * time.Second, Conns: 1}, client, server, 5202, true)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(m.GoodputBps/1e6, "Mbit/s")
			_ = srv.Proc.Stop(time.Second)
		})
	}
}

// joinDelays reads the SYNs node's NICs sent and returns, per connection
// (an MP_CAPABLE SYN and the join SYNs before the next one), the time from the
// first SYN to the last join's SYN, and the number of joins per connection.
func joinDelays(files []testbed.CaptureFile, node int) ([]time.Duration, []int, error) {
	type syn struct {
		t     float64
		join  bool
		first bool
	}
	var syns []syn

	for _, f := range files {
		if f.Node != node {
			continue
		}
		out, err := exec.Command("tshark", "-n", "-r", f.Path, "-Y", "tcp.flags.syn == 1 && tcp.flags.ack == 0 && eth.src == "+f.NodeMAC,
			"-T", "fields", "-e", "frame.time_epoch", "-e", "tcp.options.mptcp.subtype").Output()
		if err != nil {
			return nil, nil, fmt.Errorf("tshark %s: %w", f.Path, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			fields := strings.Split(sc.Text(), "\t")
			if len(fields) != 2 {
				continue
			}
			t, err := strconv.ParseFloat(fields[0], 64)
			if err != nil {
				return nil, nil, err
			}
			syns = append(syns, syn{t: t, join: fields[1] == "1", first: fields[1] == "0"})
		}
	}
	slices.SortFunc(syns, func(a, b syn) int {
		switch {
		case a.t < b.t:
			return -1
		case a.t > b.t:
			return 1
		}
		return 0
	})
	var delays []time.Duration
	var joins []int
	for i, s := range syns {
		if !s.first {
			continue
		}
		last, n := 0.0, 0
		for _, j := range syns[i+1:] {
			if j.first {
				break
			}
			if j.join {
				last, n = j.t, n+1
			}
		}
		joins = append(joins, n)
		if n > 0 {
			delays = append(delays, time.Duration((last-s.t)*float64(time.Second)))
		}
	}
	return delays, joins, nil
}
