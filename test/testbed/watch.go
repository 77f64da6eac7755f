package testbed

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// A Watch keeps the evidence of a transfer: header captures of every wire
// run while it is open, and if the transfer fails, the captures, the
// sockets and MPTCP counters of every pod and node, and whatever the test's
// collectors add (an agent's datapath counters) are saved in a directory
// that the failure message names. A transfer that passes leaves nothing.
//
// A changed stream always fails the test (Fail). A stall may be tried again
// only by a test that names its reason (Retry), and every such retry is
// logged and counted (see RetryLog).
type Watch struct {
	t          testing.TB
	bed        *Bed
	caps       *Captures
	collectors []Collector
	closed     bool
}

// A Collector writes what it knows of a failed transfer into dir.
type Collector func(dir string) error

// Watch starts captures on every wire (headers only) and returns the watch;
// Close it when the transfer is over.
func (b *Bed) Watch(t testing.TB, collectors ...Collector) *Watch {
	t.Helper()
	return b.watch(t, headerSnap, collectors)
}

// WatchPayload is Watch capturing every byte, so that the evidence of a
// changed stream shows what each wire carried (changed-packets.txt then
// compares each carrier's payload with what was sent). It costs more CPU
// and disk: for reproducers.
func (b *Bed) WatchPayload(t testing.TB, collectors ...Collector) *Watch {
	t.Helper()
	return b.watch(t, 0, collectors)
}

func (b *Bed) watch(t testing.TB, snap int, collectors []Collector) *Watch {
	t.Helper()
	RequireTools(t, CaptureTools...)
	caps, err := b.startCaptures("tcp", snap)
	if err != nil {
		t.Fatalf("starting the captures of a watched transfer: %v", err)
	}
	w := &Watch{t: t, bed: b, caps: caps, collectors: collectors}
	t.Cleanup(w.Close)
	return w
}

// Captures stops the captures and returns them, for a test that analyzes
// them; they stay evidence until Close.
func (w *Watch) Captures() ([]CaptureFile, error) { return w.caps.Stop() }

// Close stops the captures and removes them: nothing failed.
func (w *Watch) Close() {
	if w.closed {
		return
	}
	w.closed = true
	w.caps.Discard()
}

// Fail saves the evidence of err and fails the test, naming where the
// evidence is. A changed stream is named as such first.
func (w *Watch) Fail(err error) {
	w.t.Helper()
	dir := w.save(err)
	var te *TrafficError
	if errors.As(err, &te) && te.Changed() {
		w.t.Fatalf("A STREAM ARRIVED CHANGED (never retried): %v\nevidence: %s", err, dir)
	}
	w.t.Fatalf("%v\nevidence: %s", err, dir)
}

// Match checks what arrived against what was sent (MatchReports) and
// returns the server's reports by the sender's address; a changed, stalled
// or broken stream fails the test with the evidence.
func (w *Watch) Match(sent []SenderReport, got []ServerReport) map[string]ServerReport {
	w.t.Helper()
	byRemote, err := MatchReports(sent, got)
	if err != nil {
		w.Fail(err)
	}
	return byRemote
}

// Keep saves the evidence of err without failing the test, and returns
// where it is: for a test that goes on to count failures.
func (w *Watch) Keep(err error) string {
	w.t.Helper()
	return w.save(err)
}

// Retry decides whether a failed attempt may be tried again: only when
// every failure is a stall and the test named its reason. The evidence of
// the stalled attempt is kept either way, and the retry is logged and
// recorded for the summary of `make test`. A changed stream or a broken
// connection fails the test at once.
func (w *Watch) Retry(err error, reason string) {
	w.t.Helper()
	var te *TrafficError
	if !errors.As(err, &te) || !te.OnlyStalled() {
		w.Fail(err)
	}
	w.RetryMiss(err, reason)
}

// RetryMiss is Retry for a transfer that arrived whole but missed a target
// its test measures (a stall, the goodput during a failure): the test
// names the reason it may run the transfer once more, and RetryMiss keeps
// the evidence, logs and records the retry, and returns where the
// evidence is. Without a reason the test fails.
func (w *Watch) RetryMiss(err error, reason string) string {
	w.t.Helper()
	if reason == "" {
		w.Fail(err)
	}
	dir := w.save(err)
	w.t.Logf("RETRY (%s): %v\nevidence: %s", reason, err, dir)
	recordRetry(w.t, reason, dir)
	return dir
}

// save writes the evidence of err into a new directory and returns it.
func (w *Watch) save(err error) string {
	w.t.Helper()
	dir, derr := evidenceDir(w.t)
	if derr != nil {
		w.t.Errorf("no directory for the evidence: %v", derr)
		return "(not saved)"
	}
	var problems []string
	note := func(what string, err error) {
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", what, err))
		}
	}
	note("failure.txt", os.WriteFile(filepath.Join(dir, "failure.txt"), []byte(err.Error()+"\n"), 0o644))
	// Counters first: they keep moving while the captures are stopped.
	for _, n := range w.bed.Nodes {
		note(n.NetNS, w.bed.saveCommand(dir, n.NetNS, "nstat", "nstat", "-az"))
		for _, p := range n.Pods {
			note(p.NetNS, w.bed.saveCommand(dir, p.NetNS, "ss", "ss", "-tainoM"))
			note(p.NetNS, w.bed.saveCommand(dir, p.NetNS, "nstat", "nstat", "-az"))
		}
	}
	for _, c := range w.collectors {
		note("collector", c(dir))
	}
	if !w.closed {
		// The evidence moves out; Close has nothing left to remove.
		w.closed = true
		files, serr := w.caps.Stop()
		note("stopping captures", serr)
		for i, f := range files {
			moved := filepath.Join(dir, filepath.Base(f.Path))
			note("moving "+f.Path, os.Rename(f.Path, moved))
			files[i].Path = moved
		}
		note("changed-packets.txt", writeCarriers(dir, files, err))
	}
	if len(problems) > 0 {
		w.t.Logf("evidence in %s is incomplete: %s", dir, strings.Join(problems, "; "))
	}
	return dir
}

// saveCommand runs args in namespace ns and writes the output to
// dir/<ns>-<name>.txt.
func (b *Bed) saveCommand(dir, ns, name string, args ...string) error {
	out, err := b.Command(ns, args...).CombinedOutput()
	if werr := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s.txt", ns, name)), out, 0o644); werr != nil {
		return werr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// evidenceDir returns a new directory for a failure's evidence: under the
// test's artifact directory when `go test -artifacts` keeps it (make test
// does), otherwise a directory of its own under the system's temporary
// directory that nothing removes.
func evidenceDir(t testing.TB) (string, error) {
	base := os.TempDir()
	if f := flag.Lookup("test.artifacts"); f != nil && f.Value.String() == "true" {
		base = t.ArtifactDir()
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return os.MkdirTemp(base, fmt.Sprintf("evidence-%s-%s-", name, time.Now().Format("150405")))
}

// RetryLogEnv names the file where transfers tried again are recorded (a
// stall a test names, a goodput measurement repeated on a shared machine),
// one line each, for the summary `make test` prints at its end.
const RetryLogEnv = "MPTCP_RETRY_LOG"

var retryLogMu sync.Mutex

func recordRetry(t testing.TB, reason, dir string) {
	path := os.Getenv(RetryLogEnv)
	if path == "" {
		return
	}
	retryLogMu.Lock()
	defer retryLogMu.Unlock()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Logf("recording the retry in %s: %v", path, err)
		return
	}
	defer f.Close()
	_, _ = fmt.Fprintf(f, "%s\t%s\t%s\n", t.Name(), reason, dir)
}

// writeCarriers writes, for every changed stream of err, the captured
// packets that carried its changed ranges (DecodeChangedRanges) into
// dir/changed-packets.txt.
func writeCarriers(dir string, files []CaptureFile, err error) error {
	var te *TrafficError
	if !errors.As(err, &te) {
		return nil
	}
	var b strings.Builder
	for _, f := range te.Failures {
		if f.Kind != StreamChanged || f.Got == nil || f.Got.Verification == nil || len(f.Got.Verification.Ranges) == 0 {
			continue
		}
		initial, perr := netip.ParseAddrPort(f.Sent.Local)
		if perr != nil {
			return perr
		}
		pkts, derr := DecodeChangedRanges(files, initial, f.Got.Verification.Ranges)
		if derr != nil {
			return derr
		}
		if err := WriteConnectionStart(dir, strconv.Itoa(f.Sent.Conn), files, initial); err != nil {
			return err
		}
		fmt.Fprintf(&b, "connection %d from %s, changed ranges %v: %d captured packets carried them (its start: connection-start-%d-node*.txt)\n",
			f.Sent.Conn, f.Sent.Local, f.Got.Verification.Ranges, len(pkts), f.Sent.Conn)
		v := f.Got.Verification
		for _, p := range pkts {
			fmt.Fprintf(&b, "  %v%s\n", p, p.comparePayload(v.Seed, v.Conn))
		}
	}
	if b.Len() == 0 {
		return nil
	}
	return os.WriteFile(filepath.Join(dir, "changed-packets.txt"), []byte(b.String()), 0o644)
}
