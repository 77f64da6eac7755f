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

// StartTrafficServer starts bin ("traffic", see BuildTraffic) as a server on pod:port and waits until it listens.
// Extra flags (e.g. "-window", "3s") are passed through.
func (b *Bed) StartTrafficServer(ctx context.Context, bin string, pod *Pod, port int, mptcp bool, extra ...string) (*TrafficServer, error) {
	s := &TrafficServer{Pod: pod, Addr: netip.AddrPortFrom(pod.Addr, uint16(port))}
	s.Report = filepath.Join(b.Dir, fmt.Sprintf("serve-%s-%d.jsonl", pod.Name, port))
	args := []string{bin, "serve", "-listen", s.Addr.String(), "-report", s.Report}
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

// Reports returns the connections the server has finished so far.
func (s *TrafficServer) Reports() ([]ServerReport, error) {
	data, err := os.ReadFile(s.Report)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var out []ServerReport
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var r ServerReport
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("server report %q: %w", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out, nil
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
// returns an error unless every sent stream arrived whole, with the same SHA-256.
func MatchReports(sent []SenderReport, got []ServerReport) (map[string]ServerReport, error) {
	byRemote := map[string]ServerReport{}
	for _, r := range got {
		byRemote[r.Remote] = r
	}
	for _, s := range sent {
		r, ok := byRemote[s.Local]
		if !ok {
			return byRemote, fmt.Errorf("connection %d from %s: no server report", s.Conn, s.Local)
		}
		if r.Bytes != s.Bytes || r.SHA256 != s.SHA256 {
			var all []string
			for _, x := range sent {
				all = append(all, fmt.Sprintf("sent %d %s %d %.8s", x.Conn, x.Local, x.Bytes, x.SHA256))
			}
			for _, x := range got {
				all = append(all, fmt.Sprintf("got %s->%s %d %.8s", x.Remote, x.Local, x.Bytes, x.SHA256))
			}
			return byRemote, fmt.Errorf("connection %d from %s: sent %d bytes sha256 %s, received %d bytes sha256 %s; %s; all reports: %v",
				s.Conn, s.Local, s.Bytes, s.SHA256, r.Bytes, r.SHA256, blockDifferences(s.Blocks, r.Blocks), all)
		}
	}
	return byRemote, nil
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
