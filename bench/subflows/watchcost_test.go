package subflows

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// watchedConns are the pod sizes BenchmarkWatchCost lists: a few, many,
// and about the most a path manager remembers (8192 connections).
var watchedConns = []int{100, 1000, 8000}

// watchResult is one pod size's listings, and its lookups of one and of
// maxLookups waiting connections.
type watchResult struct {
	conns               int
	per, one, lookupMax []time.Duration
}

// maxLookups is the path manager's: up to that many waiting connections,
// a reading looks each up instead of listing.
const maxLookups = podnet.MaxLookups

// BenchmarkWatchCost measures what the path manager pays to read what a
// pod's waiting connections carried (docs/subflows.md, "Small flows"): one
// sock_diag listing of the pod's subflows, with n MPTCP connections open in
// the pod's namespace, b.N listings per size. The CPU share follows from
// the pace of the readings.
//
//	BENCH_REPORT=$PWD/docs/benchmarks.md go test -run '^$' -bench BenchmarkWatchCost -benchtime 200x ./bench/subflows/
func BenchmarkWatchCost(b *testing.B) {
	testutil.RequireRoot(b, "ip")
	var results []watchResult
	for _, n := range watchedConns {
		b.Run(fmt.Sprintf("conns=%d", n), func(b *testing.B) {
			// As a path manager reads: on a socket it keeps.
			lister := mptcpnl.NewLister(podWithConns(b, n))
			defer lister.Close()
			r := watchResult{conns: n}
			var sfs []mptcpnl.Subflow
			lookup := func(k int) time.Duration {
				start := time.Now()
				for _, sf := range sfs[:k] {
					if _, ok, err := lister.Subflow(sf.Local, sf.Remote); err != nil || !ok {
						b.Fatalf("looking %v up: %v, found %v", sf.Local, err, ok)
					}
				}
				return time.Since(start)
			}
			for b.Loop() {
				start := time.Now()
				var err error
				sfs, err = lister.Subflows()
				r.per = append(r.per, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
				// A few of thousands of connections opened at
				// once may fall back to TCP (no subflow to list).
				if len(sfs) < n*99/100 || len(sfs) > n {
					b.Fatalf("listed %d subflows, want about %d", len(sfs), n)
				}
				r.one = append(r.one, lookup(1))
				r.lookupMax = append(r.lookupMax, lookup(maxLookups))
			}
			b.ReportMetric(float64(testutil.Median(r.per).Microseconds()), "µs/listing")
			results = append(results, r)
		})
	}
	if path := os.Getenv("BENCH_REPORT"); path != "" && len(results) == len(watchedConns) {
		if err := benchdoc.ReplaceSection(path, watchSection, watchReport(results)); err != nil {
			b.Fatal(err)
		}
	}
}

// podWithConns makes a client namespace with n MPTCP connections open to a
// server namespace over a veth, and returns the client namespace's
// descriptor; everything goes at the end of the benchmark.
func podWithConns(b *testing.B, n int) int {
	b.Helper()
	client, server := testutil.NetNSPair(b, "mptwc-")
	// Room in the accept queue for every connection: one that overflows
	// it is answered with a SYN cookie, and falls back to TCP.
	if err := netnsutil.WriteSysctl("/var/run/netns/"+server, "net.core.somaxconn", "16384"); err != nil {
		b.Fatal(err)
	}
	var ln net.Listener
	if err := netnsutil.Do("/var/run/netns/"+server, func() error {
		lc := net.ListenConfig{}
		lc.SetMultipathTCP(true)
		var err error
		ln, err = lc.Listen(context.Background(), "tcp", "192.0.2.2:5201")
		return err
	}); err != nil {
		b.Fatal(err)
	}
	var conns []net.Conn
	b.Cleanup(func() {
		ln.Close()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	if err := netnsutil.Do("/var/run/netns/"+client, func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(true)
		for range n {
			c, err := d.Dial("tcp", "192.0.2.2:5201")
			if err != nil {
				return err
			}
			// What a connection that waits for its threshold
			// looks like: some bytes carried.
			if _, err := c.Write([]byte("hello")); err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	fd, err := netnsutil.Open("/var/run/netns/" + client)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = unix.Close(fd) })
	return fd
}

const watchSection = "## Small flows: watching the waiting connections"

func watchReport(results []watchResult) string {
	var s strings.Builder
	fmt.Fprintf(&s, "%s\n\n", watchSection)
	fmt.Fprintf(&s, "`BENCH_REPORT=$PWD/docs/benchmarks.md go test -run '^$' -bench BenchmarkWatchCost -benchtime %dx ./bench/subflows/` "+
		"(part of `make bench-smallflows`), %s. A pod's path manager reads what its waiting connections carried from the pod's kernel "+
		"(sock_diag, docs/subflows.md, \"Small flows\"); here a namespace holds n MPTCP connections, each with a few bytes carried, and "+
		"one reading at a time. Up to %d waiting connections a reading looks each one's first subflow up (one request each); past "+
		"that it lists all the pod's subflows (a dump, which walks the kernel's whole table of connections). The share of a core follows "+
		"from the pace: a reading every 20 ms while a connection younger than 200 ms waits. Times are min/median; "+
		"\"core\" is the share of a core at a reading every 20 ms.\n\n", len(results[0].per), machineLine(), maxLookups)
	fmt.Fprintf(&s, "| connections | listing | core, listing /20 ms | 1 lookup | %d lookups | core, %d lookups /20 ms |\n"+
		"|---|---|---|---|---|---|\n", maxLookups, maxLookups)
	us := func(d time.Duration) string { return d.Round(time.Microsecond).String() }
	for _, r := range results {
		fmt.Fprintf(&s, "| %d | %s/%s | %.1f %% | %s/%s | %s/%s | %.1f %% |\n", r.conns, us(minOf(r.per)), us(testutil.Median(r.per)),
			100*testutil.Median(r.per).Seconds()/0.02, us(minOf(r.one)), us(testutil.Median(r.one)), us(minOf(r.lookupMax)), us(testutil.Median(r.lookupMax)),
			100*testutil.Median(r.lookupMax).Seconds()/0.02)
	}
	return strings.TrimRight(s.String(), "\n") + "\n"
}

func minOf(v []time.Duration) time.Duration {
	lo := v[0]
	for _, x := range v[1:] {
		lo = min(lo, x)
	}
	return lo
}
