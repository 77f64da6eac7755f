// Package preload measures what the preload library (preload/) costs a
// program: its socket() against a program that asks for MPTCP itself, and
// against plain TCP; and a connect over loopback the same three ways.
package preload

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/preload"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

const section = "## Preload library: cost"

// variant is how the measured program gets its sockets.
type variant struct {
	name    string
	preload bool // LD_PRELOAD=libmptcp-socket.so
	mptcp   bool // the program asks for IPPROTO_MPTCP itself
}

var variants = []variant{
	{name: "TCP (no library)"},
	{name: "the library (TCP asked, MPTCP given)", preload: true},
	{name: "MPTCP asked by the program", mptcp: true},
}

// operation is what the program times, n times in a row: its arguments
// for a listener on port.
type operation struct {
	name string
	args func(port int) []string
}

var operations = []operation{
	{name: "socket() + close()", args: func(int) []string { return []string{"socket", "200000"} }},
	{name: "socket() + connect() + close() over loopback", args: func(port int) []string { return []string{"connect", "5000", strconv.Itoa(port)} }},
}

func BenchmarkPreloadCost(b *testing.B) {
	dir := b.TempDir()
	prog := filepath.Join(dir, "cost")
	testutil.CompileC(b, filepath.Join("testdata", "cost.c"), prog)
	lib, err := preload.Install(dir)
	if err != nil {
		b.Fatal(err)
	}
	// A listener that accepts both, and closes what it accepts.
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(true)
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	ns := map[string][]float64{}
	for b.Loop() {
		// Variants interleaved in each round, so that the machine's
		// moods fall on all of them.
		for _, op := range operations {
			for _, v := range variants {
				args := op.args(port)
				if v.mptcp {
					args = append(args, "mptcp")
				}
				cmd := exec.Command(prog, args...)
				cmd.Env = os.Environ()
				if v.preload {
					cmd.Env = append(cmd.Env, "LD_PRELOAD="+lib)
				}
				out, err := cmd.CombinedOutput()
				if err != nil {
					b.Fatalf("%s, %s: %v: %s", op.name, v.name, err, out)
				}
				f, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
				if err != nil {
					b.Fatalf("%s, %s: %q", op.name, v.name, out)
				}
				key := op.name + "|" + v.name
				ns[key] = append(ns[key], f)
			}
		}
	}
	var s strings.Builder
	fmt.Fprintf(&s, "%s\n\n`BENCH_REPORT=$PWD/docs/benchmarks.md go test -run '^$' -bench BenchmarkPreloadCost -benchtime %dx ./bench/preload/`, "+
		"on %s: %s, %d CPUs, Linux %s. One C program (bench/preload/testdata/cost.c) times each operation in a loop in one "+
		"process and prints the mean; each round runs every variant, interleaved. Nanoseconds per operation, min / median "+
		"over the rounds; the ratio is the medians' against the program that asks for MPTCP itself, which is what the library "+
		"makes of a program that asks for TCP.\n\n", section, len(ns[operations[0].name+"|"+variants[0].name]),
		time.Now().UTC().Format("2006-01-02"), benchdoc.CPUModel(), runtime.NumCPU(), benchdoc.KernelRelease())
	s.WriteString(costTable(ns))
	b.Log("\n" + s.String())
	if path := os.Getenv("BENCH_REPORT"); path != "" {
		if err := benchdoc.ReplaceSection(path, section, s.String()); err != nil {
			b.Fatal(err)
		}
	}
}

// costTable is the report's table: ns, by operation and variant, each
// "operation|variant".
func costTable(ns map[string][]float64) string {
	var s strings.Builder
	s.WriteString("| operation | variant | ns min / median | against MPTCP asked |\n|---|---|---|---|\n")
	for _, op := range operations {
		base := testutil.Median(ns[op.name+"|"+variants[2].name])
		for _, v := range variants {
			xs := ns[op.name+"|"+v.name]
			fmt.Fprintf(&s, "| %s | %s | %.0f / %.0f | %.3f |\n", op.name, v.name, slices.Min(xs), testutil.Median(xs),
				testutil.Median(xs)/base)
		}
	}
	return s.String()
}
