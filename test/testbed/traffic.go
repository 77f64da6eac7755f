package testbed

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mptcp-operator/mptcp-operator/hack/traffic/report"
)

// ServerReport is one line of "traffic serve -report" (hack/traffic), one per
// closed connection; SenderReport one line of "traffic send -json".
type (
	ServerReport = report.Server
	SenderReport = report.Sender
)

// TrafficServer is a running "traffic serve" in a pod.
type TrafficServer struct {
	Pod    *Pod
	Addr   netip.AddrPort
	Report string
	Proc   *Process
}

// serverDrain is how long a stopped server lets open connections go on
// before it reports them as stopped; Stop waits longer than that.
const serverDrain = time.Second

// StartTrafficServer starts bin ("traffic", see BuildTraffic) as a server on pod:port and waits until it listens.
// Extra flags (e.g. "-window", "3s") are passed through. Every server gets a report file of its own, so a server
// started again on the same port never shows the lines of an earlier one.
func (b *Bed) StartTrafficServer(ctx context.Context, bin string, pod *Pod, port int, mptcp bool, extra ...string) (*TrafficServer, error) {
	s := &TrafficServer{Pod: pod, Addr: netip.AddrPortFrom(pod.Addr, uint16(port))}
	s.Report = filepath.Join(b.Dir, fmt.Sprintf("serve-%s-%d-%d.jsonl", pod.Name, port, b.nextSeq()))
	args := []string{bin, "serve", "-listen", s.Addr.String(), "-report", s.Report, "-drain", serverDrain.String()}
	if mptcp {
		args = append(args, "-mptcp")
	}
	p, err := b.Start(pod.NetNS, append(args, extra...)...)
	if err != nil {
		return nil, err
	}
	s.Proc = p
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return s, p.WaitOutput(wctx, "listening on")
}

// Stop stops the server; connections still open are reported as stopped.
func (s *TrafficServer) Stop() error { return s.Proc.Stop(serverDrain + 2*time.Second) }

// Reports returns the connections the server has finished so far.
func (s *TrafficServer) Reports() ([]ServerReport, error) {
	data, err := os.ReadFile(s.Report)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	return parseServerReports(data)
}

// parseServerReports reads a traffic server's report: a JSON line per
// connection.
func parseServerReports(data []byte) ([]ServerReport, error) {
	var out []ServerReport
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var r ServerReport
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("server report %q: %w", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// WaitReports waits until the server has reported n connections.
func (s *TrafficServer) WaitReports(ctx context.Context, n int) ([]ServerReport, error) {
	for {
		r, err := s.Reports()
		if err != nil || len(r) >= n {
			return r, err
		}
		select {
		case <-ctx.Done():
			return r, fmt.Errorf("server on %s reported %d of %d connections: %w", s.Addr, len(r), n, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Send runs "traffic send" from pod to the server and returns its per-connection reports. args are extra flags,
// e.g. "-conns", "2", "-duration", "5s".
func (b *Bed) Send(ctx context.Context, bin string, pod *Pod, to netip.AddrPort, mptcp bool, args ...string) ([]SenderReport, error) {
	full := []string{bin, "send", "-to", to.String(), "-json"}
	if mptcp {
		full = append(full, "-mptcp")
		b.mu.Lock()
		joins := b.awaitJoins[pod]
		b.mu.Unlock()
		if joins > 0 {
			full = append(full, "-await-joins", strconv.Itoa(joins))
		}
	}
	cmd := b.CommandContext(ctx, pod.NetNS, append(full, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var reps []SenderReport
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r SenderReport
		if jerr := json.Unmarshal(sc.Bytes(), &r); jerr == nil {
			reps = append(reps, r)
		}
	}
	if err != nil {
		return reps, fmt.Errorf("traffic send from %s: %w: %s", pod, err, stderr.String())
	}
	return reps, nil
}

// MatchReports pairs sender and server reports by the sender's local address (the server's remote address) and
// returns an error unless every sent stream arrived whole, with the same SHA-256. The error is a *TrafficError that
// says what went wrong: a changed stream, a stall, or a broken connection.
func MatchReports(sent []SenderReport, got []ServerReport) (map[string]ServerReport, error) {
	byRemote := map[string]ServerReport{}
	for _, r := range got {
		byRemote[r.Remote] = r
	}
	terr := &TrafficError{}
	for _, s := range sent {
		r, ok := byRemote[s.Local]
		var rp *ServerReport
		if ok {
			rp = &r
		}
		if f := classify(s, rp); f != nil {
			terr.Failures = append(terr.Failures, *f)
		}
	}
	if len(terr.Failures) == 0 {
		return byRemote, nil
	}
	for _, x := range sent {
		terr.reports = append(terr.reports, fmt.Sprintf("sent %d %s %d %.8s %s", x.Conn, x.Local, x.Bytes, x.SHA256, x.Error))
	}
	for _, x := range got {
		terr.reports = append(terr.reports, fmt.Sprintf("got %s->%s %d %.8s %s", x.Remote, x.Local, x.Bytes, x.SHA256, x.Error))
	}
	return byRemote, terr
}

// FailureKind says how a transfer failed.
type FailureKind string

const (
	// StreamChanged: bytes arrived that were not sent, or not where they were sent, or fewer or more bytes than
	// the sender wrote arrived on a connection both ends finished. Never retried: it fails the test and keeps its
	// evidence.
	StreamChanged FailureKind = "changed"
	// StreamStalled: the connection made no progress (a write of the sender waited 5 s in vain, or the server was
	// stopped while it was open), and what did arrive is what was sent. Only a test that names the reason may try
	// again.
	StreamStalled FailureKind = "stalled"
	// StreamBroken: the connection failed (refused, reset) or was never reported.
	StreamBroken FailureKind = "broken"
)

// Failure is what went wrong with one connection.
type Failure struct {
	Kind   FailureKind
	Sent   SenderReport
	Got    *ServerReport // nil when the server never reported the connection
	Detail string
}

func (f Failure) String() string {
	return fmt.Sprintf("%s: connection %d from %s: %s", f.Kind, f.Sent.Conn, f.Sent.Local, f.Detail)
}

// TrafficError lists the connections of a transfer that failed.
type TrafficError struct {
	Failures []Failure
	reports  []string
}

func (e *TrafficError) Error() string {
	var lines []string
	for _, f := range e.Failures {
		lines = append(lines, f.String())
	}
	return fmt.Sprintf("%s; all reports: %v", strings.Join(lines, "; "), e.reports)
}

// Changed reports whether any stream arrived changed.
func (e *TrafficError) Changed() bool { return e.worst() == StreamChanged }

// OnlyStalled reports whether every failure is a stall.
func (e *TrafficError) OnlyStalled() bool { return e.worst() == StreamStalled }

func (e *TrafficError) worst() FailureKind {
	worst := StreamStalled
	for _, f := range e.Failures {
		switch f.Kind {
		case StreamChanged:
			return StreamChanged
		case StreamBroken:
			worst = StreamBroken
		}
	}
	return worst
}

// classify says what, if anything, went wrong with the connection s,
// which the server reported as r (nil: never reported).
func classify(s SenderReport, r *ServerReport) *Failure {
	f := &Failure{Sent: s, Got: r}
	// A changed byte is the worst outcome and is looked for first, in
	// whatever arrived, complete or not.
	if r != nil && r.Verification != nil && len(r.Verification.Ranges) > 0 {
		f.Kind, f.Detail = StreamChanged, describeChanges(r.Verification)
		return f
	}
	stalled := strings.Contains(s.Error, "i/o timeout") || (r != nil && r.Stopped)
	switch {
	case r == nil && stalled:
		f.Kind, f.Detail = StreamStalled, fmt.Sprintf("the sender gave up after %d bytes (%s) and the server never reported the connection", s.Bytes, s.Error)
	case r == nil:
		f.Kind, f.Detail = StreamBroken, fmt.Sprintf("the server never reported the connection (sender: %d bytes, %q)", s.Bytes, s.Error)
	case s.Error != "" && !stalled, r.Error != "" && !r.Stopped:
		f.Kind, f.Detail = StreamBroken, fmt.Sprintf("sender %q after %d bytes, server %q after %d bytes", s.Error, s.Bytes, r.Error, r.Bytes)
	case stalled && (r.Bytes < s.Bytes || r.SHA256 == s.SHA256):
		// What arrived was compared with what was sent above (the
		// verifier); the rest never came.
		f.Kind, f.Detail = StreamStalled, fmt.Sprintf("the transfer did not finish in time: sender %q after %d bytes, server has %d (stopped %v)", s.Error, s.Bytes, r.Bytes, r.Stopped)
	case r.Bytes != s.Bytes || r.SHA256 != s.SHA256:
		f.Kind, f.Detail = StreamChanged, fmt.Sprintf("sent %d bytes sha256 %s, received %d bytes sha256 %s; %s",
			s.Bytes, s.SHA256, r.Bytes, r.SHA256, blockDifferences(s.Blocks, r.Blocks))
	default:
		return nil
	}
	return f
}

// describeChanges renders a verifier's findings: where the stream
// differs and what arrived there.
func describeChanges(v *report.Verification) string {
	var parts []string
	for i, rg := range v.Ranges {
		p := fmt.Sprintf("[%d, %d) (%d bytes)", rg.Start, rg.End, rg.End-rg.Start)
		if i < len(v.Samples) {
			smp := v.Samples[i]
			switch {
			case smp.FoundAt >= 0:
				p += fmt.Sprintf(" holds sent bytes from offset %d (shift %+d)", smp.FoundAt, smp.FoundAt-smp.Offset)
			default:
				p += fmt.Sprintf(" holds bytes never sent near there: got %s want %s", smp.Got, smp.Want)
			}
		}
		if rg.Truncated {
			p += " and more"
		}
		parts = append(parts, p)
	}
	return fmt.Sprintf("%d changed range(s) in the stream (seed %d, connection %d): %s", len(v.Ranges), v.Seed, v.Conn, strings.Join(parts, "; "))
}

// Mbps formats bits/s as Mbit/s.
func Mbps(bps float64) string { return strconv.FormatFloat(bps/1e6, 'f', 1, 64) + " Mbit/s" }

// StartEcho starts "traffic echo" (a UDP echo server) on pod:port and waits until it listens.
func (b *Bed) StartEcho(ctx context.Context, bin string, pod *Pod, port int) (netip.AddrPort, error) {
	addr := netip.AddrPortFrom(pod.Addr, uint16(port))
	p, err := b.Start(pod.NetNS, bin, "echo", "-listen", addr.String())
	if err != nil {
		return addr, err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return addr, p.WaitOutput(wctx, "listening on")
}

// Probe sends count numbered UDP datagrams from pod to an echo server, one every interval, and returns how many
// came back: a round trip survives only if both directions carried it.
func (b *Bed) Probe(ctx context.Context, bin string, pod *Pod, to netip.AddrPort, count int, interval time.Duration) (received int, err error) {
	out, err := b.CommandContext(ctx, pod.NetNS, bin, "probe", "-to", to.String(), "-count", strconv.Itoa(count),
		"-interval", interval.String(), "-wait", "500ms").Output()
	if err != nil {
		return 0, fmt.Errorf("traffic probe from %s: %w", pod, err)
	}
	var r struct {
		Sent, Received int
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
		return 0, fmt.Errorf("traffic probe output %q: %w", out, err)
	}
	return r.Received, nil
}

// blockDifferences says which 1 MiB blocks of two streams differ: a few
// scattered blocks point at corrupted segments, every block from one on at
// a lost or shifted range.
func blockDifferences(sent, got []string) string {
	var differ []int
	n := min(len(sent), len(got))
	for i := range n {
		if sent[i] != got[i] {
			differ = append(differ, i)
		}
	}
	if len(differ) == 0 {
		return fmt.Sprintf("the streams agree on their first %d MiB", n)
	}
	return fmt.Sprintf("%d of %d MiB blocks differ, the first at offset %d, blocks %v", len(differ), n, int64(differ[0])<<20, differ)
}

// Stall is a stretch of a server's samples below a rate.
type Stall struct {
	// Start is from the connection's first byte.
	Start, Length time.Duration
}

// Stalls lists r's stretches of whole samples below threshold (bit/s)
// after skip, at least min long, in order. The last sample is left out: it
// holds the connection's end.
func Stalls(r ServerReport, threshold float64, skip, min time.Duration) []Stall {
	if r.SampleSeconds <= 0 || len(r.Samples) < 2 {
		return nil
	}
	interval := time.Duration(r.SampleSeconds * float64(time.Second))
	limit := threshold / 8 * r.SampleSeconds // bytes per interval
	var out []Stall
	run := 0
	flush := func(end int) {
		if l := time.Duration(run) * interval; run > 0 && l >= min {
			out = append(out, Stall{Start: time.Duration(end-run) * interval, Length: l})
		}
		run = 0
	}
	samples := r.Samples[:len(r.Samples)-1]
	for i, n := range samples {
		if time.Duration(i)*interval < skip {
			continue
		}
		if float64(n) < limit {
			run++
		} else {
			flush(i)
		}
	}
	flush(len(samples))
	return out
}

// LongestStall returns the longest stretch in which connection r received
// less than threshold bits/s, in whole sampling intervals (serve -sample),
// from skip after its first byte to its last complete interval. 0 without
// samples.
func LongestStall(r ServerReport, threshold float64, skip time.Duration) time.Duration {
	var longest time.Duration
	for _, st := range Stalls(r, threshold, skip, 0) {
		longest = max(longest, st.Length)
	}
	return longest
}
