// Command traffic moves hashed, deterministic byte streams between test-bed pods over MPTCP or plain TCP.
//
//	traffic serve -listen 10.244.2.11:5201 -mptcp -report server.jsonl
//	traffic send  -to 10.244.2.11:5201 -mptcp -conns 2 -duration 10s -seed 7 -json
//
//	traffic echo  -listen 10.244.2.11:7
//	traffic probe -to 10.244.2.11:7 -count 500 -interval 2ms
//
//	traffic await -condition mptcp.io/ready   (in a pod: until its own condition is True)
//
//	traffic sink  -listen 10.244.2.11:5201 -mptcp       (a cheap stream, for VM guests: blast.go)
//	traffic blast -to 10.244.2.11:5201 -mptcp -duration 10s
//
// The server reads every connection to its end and writes one JSON line per connection: the bytes received, their
// SHA-256 and the goodput measured over a stated window (skip -warmup after the connection's first byte, then count
// what arrives during -window). The sender prints one JSON line per connection with the SHA-256 of what it sent, so
// a test can check the data end to end. echo and probe are a UDP round trip counter (the machines have no ping):
// probe prints how many of its numbered datagrams came back.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/hack/traffic/report"
	"github.com/mptcp-operator/mptcp-operator/hack/traffic/stream"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: traffic serve|send|echo|probe|await|blast|sink [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "send":
		err = send(os.Args[2:])
	case "echo":
		err = echo(os.Args[2:])
	case "probe":
		err = probe(os.Args[2:])
	case "await":
		err = await(os.Args[2:])
	case "blast":
		err = blast(os.Args[2:])
	case "sink":
		err = sink(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (want serve, send, echo, probe, await, blast or sink)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "traffic:", err)
		os.Exit(1)
	}
}

// ServerReport and SenderReport are the tool's output lines, shared with the
// test bed that reads them.
type (
	ServerReport = report.Server
	SenderReport = report.Sender
)

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", ":5201", "address to listen on")
	mptcp := fs.Bool("mptcp", false, "listen with MPTCP (otherwise plain TCP, even though Go >= 1.24 defaults to MPTCP)")
	report := fs.String("report", "", "file to write JSON lines to, created or truncated (default stdout)")
	warmup := fs.Duration("warmup", time.Second, "time after a connection's first byte that goodput ignores")
	window := fs.Duration("window", 5*time.Second, "length of the goodput window")
	drain := fs.Duration("drain", 3*time.Second, "on SIGTERM, how long open connections may go on before they are reported as stopped")
	sample := fs.Duration("sample", 0, "report the bytes received in every interval of this length from the first byte (0: no samples)")
	goDefault := fs.Bool("go-default", false, "listen as a Go program that never chooses does (MPTCP since Go 1.24, unless GODEBUG multipathtcp says otherwise), instead of saying -mptcp or not")
	_ = fs.Parse(args)
	if *goDefault && *mptcp {
		return errors.New("-go-default and -mptcp exclude each other")
	}

	out := os.Stdout
	if *report != "" {
		f, err := os.OpenFile(*report, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	var lc net.ListenConfig
	if !*goDefault {
		lc.SetMultipathTCP(*mptcp)
	}
	ln, err := lc.Listen(context.Background(), "tcp", *listen)
	if err != nil {
		return err
	}
	// Tests wait for this line before they start senders.
	fmt.Fprintf(os.Stderr, "listening on %s mptcp=%v\n", ln.Addr(), *mptcp)

	srv := &server{out: out, warmup: *warmup, window: *window, sample: *sample, open: map[*net.TCPConn]bool{}}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sigs; ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			break
		}
		srv.handle(c.(*net.TCPConn))
	}
	srv.drain(*drain)
	return nil
}

// server reads connections and reports each one, once, before it closes
// it: a sender that saw the server's close can count on the report.
type server struct {
	out                    io.Writer
	warmup, window, sample time.Duration

	mu   sync.Mutex // guards out and open
	open map[*net.TCPConn]bool
	wg   sync.WaitGroup
}

func (s *server) handle(c *net.TCPConn) {
	s.mu.Lock()
	s.open[c] = true
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		r := receive(c, s.warmup, s.window, s.sample)
		line, _ := json.Marshal(r)
		s.mu.Lock()
		_, _ = s.out.Write(append(line, '\n'))
		delete(s.open, c)
		s.mu.Unlock()
		_ = c.Close()
	}()
}

// drain waits up to grace for the connections in flight, then ends the
// reads of those still open: each is reported with what had arrived,
// marked stopped, instead of being cut without a line.
func (s *server) drain(grace time.Duration) {
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	s.mu.Lock()
	for c := range s.open {
		_ = c.SetReadDeadline(time.Now())
	}
	s.mu.Unlock()
	<-done
}

// blockHasher hashes a stream as a whole and in 1 MiB blocks, so that when
// two ends disagree the report says where the stream first differs.
type blockHasher struct {
	whole  hash.Hash
	block  hash.Hash
	filled int
	blocks []string
}

const hashBlock = 1 << 20

func newBlockHasher() *blockHasher {
	return &blockHasher{whole: sha256.New(), block: sha256.New()}
}

func (b *blockHasher) Write(p []byte) {
	b.whole.Write(p)
	for len(p) > 0 {
		n := min(len(p), hashBlock-b.filled)
		b.block.Write(p[:n])
		b.filled += n
		p = p[n:]
		if b.filled == hashBlock {
			b.flush()
		}
	}
}

func (b *blockHasher) flush() {
	b.blocks = append(b.blocks, hex.EncodeToString(b.block.Sum(nil))[:8])
	b.block.Reset()
	b.filled = 0
}

// sums returns the whole stream's SHA-256 and the blocks' short hashes.
func (b *blockHasher) sums() (string, []string) {
	if b.filled > 0 {
		b.flush()
	}
	return hex.EncodeToString(b.whole.Sum(nil)), b.blocks
}

// goodputWindow measures what a stream delivers over [warmup, warmup +
// window] after its first byte.
type goodputWindow struct {
	warmup, window time.Duration
	first          time.Time
	// startBytes and endBytes are the bytes received when the window
	// began and ended; -1 until then.
	startBytes, endBytes int64
}

func newGoodputWindow(warmup, window time.Duration) *goodputWindow {
	return &goodputWindow{warmup: warmup, window: window, startBytes: -1, endBytes: -1}
}

// add records a read at now that took the stream from before to after
// bytes. Bytes are counted at the first read that ends past a boundary;
// with 256 KiB reads at a few hundred Mbit/s the error is well below a
// percent of a multi-second window.
func (g *goodputWindow) add(now time.Time, before, after int64) {
	if g.first.IsZero() {
		g.first = now
	}
	if g.startBytes < 0 && now.Sub(g.first) >= g.warmup {
		g.startBytes = before
	}
	if g.endBytes < 0 && now.Sub(g.first) >= g.warmup+g.window {
		g.endBytes = after
	}
}

// measure returns the window's start and length in seconds from the first
// byte, the goodput over it, and whether the stream ended before the
// window did (then the window is what there was: up to the end, and from
// the first byte when the stream ended inside the warm-up). end is when
// the stream ended, total its bytes.
func (g *goodputWindow) measure(end time.Time, total int64) (start, seconds, bps float64, short bool) {
	start = g.warmup.Seconds()
	winEnd := g.first.Add(g.warmup + g.window)
	endBytes, startBytes := g.endBytes, g.startBytes
	if endBytes < 0 {
		endBytes, winEnd, short = total, end, true
	}
	if startBytes < 0 {
		startBytes, start, short = 0, 0, true
	}
	seconds = winEnd.Sub(g.first).Seconds() - start
	if seconds > 0 {
		bps = float64(endBytes-startBytes) * 8 / seconds
	}
	return start, seconds, bps, short
}

// receive reads c to its end; the caller reports and closes it.
func receive(c *net.TCPConn, warmup, window, sample time.Duration) ServerReport {
	r := ServerReport{Local: c.LocalAddr().String(), Remote: c.RemoteAddr().String(), SampleSeconds: sample.Seconds()}
	r.MPTCP, _ = c.MultipathTCP()
	h := newBlockHasher()
	v := newVerifier()
	buf := make([]byte, 256<<10)
	gw := newGoodputWindow(warmup, window)
	for {
		n, err := c.Read(buf)
		now := time.Now()
		if n > 0 {
			h.Write(buf[:n])
			v.Write(buf[:n])
			gw.add(now, r.Bytes, r.Bytes+int64(n))
			r.Bytes += int64(n)
			if sample > 0 {
				bin := int(now.Sub(gw.first) / sample)
				for len(r.Samples) <= bin {
					r.Samples = append(r.Samples, 0)
				}
				r.Samples[bin] += int64(n)
			}
		}
		if err != nil {
			switch {
			case errors.Is(err, io.EOF):
			case errors.Is(err, os.ErrDeadlineExceeded):
				// Only drain sets a deadline.
				r.Stopped = true
				r.Error = "the server stopped while the connection was open"
			default:
				r.Error = err.Error()
			}
			break
		}
	}
	end := time.Now()
	r.SHA256, r.Blocks = h.sums()
	r.Verification = v.result()
	if gw.first.IsZero() {
		return r
	}
	r.DurationSeconds = end.Sub(gw.first).Seconds()
	r.WindowStart, r.WindowSeconds, r.GoodputBps, r.WindowShort = gw.measure(end, r.Bytes)
	return r
}

func send(args []string) error {
	fs := flag.NewFlagSet("send", flag.ExitOnError)
	to := fs.String("to", "", "server address")
	conns := fs.Int("conns", 1, "number of concurrent connections")
	serial := fs.Bool("serial", false, "open the -conns connections one after another, each once the last has ended, instead of all at once")
	duration := fs.Duration("duration", 10*time.Second, "how long each connection sends (ignored with -bytes)")
	nbytes := fs.Int64("bytes", 0, "send exactly this many bytes per connection instead of for -duration")
	mptcp := fs.Bool("mptcp", false, "dial with MPTCP")
	goDefault := fs.Bool("go-default", false, "dial as a Go program that never asks for MPTCP does (net.Dialer's default, which GODEBUG multipathtcp decides), instead of saying -mptcp or not")
	seed := fs.Uint64("seed", 1, "seed of the byte streams; connection i uses (seed, i)")
	asJSON := fs.Bool("json", false, "print one JSON line per connection (default: short text)")
	stall := fs.Duration("stall", 5*time.Second, "a write that makes no progress for this long ends the connection as stalled")
	cc := fs.String("cc", "", "TCP congestion control of the connections (with MPTCP: of every subflow); default: the namespace's")
	rate := fs.Float64("rate-mbit", 0, "pace each connection's writes to this many Mbit/s (0: as fast as the connection takes them)")
	awaitJoins := fs.Int("await-joins", 0, "with -mptcp: write the stream's preamble (or -await-after bytes), then nothing until the connection has this many joins whose "+
		"receiver answered their handshake (or -await-timeout passed), then "+
		"hold "+joinSettle.String()+" more; keeps data off joins the receiver has not taken in yet (docs/testing.md, \"Data integrity\")")
	awaitTimeout := fs.Duration("await-timeout", 2*time.Second, "how long -await-joins waits for the joins")
	awaitAfter := fs.Int("await-after", 0, "with -await-joins: write this many bytes of the stream (at least its preamble) before "+
		"waiting, for a path manager that opens joins only once a connection has carried as much (a policy's joinAfterBytes)")
	_ = fs.Parse(args)
	if *to == "" {
		return errors.New("-to is required")
	}
	if *rate < 0 {
		return errors.New("-rate-mbit must not be negative")
	}
	if *goDefault && *mptcp {
		return errors.New("-go-default and -mptcp exclude each other")
	}
	if *awaitJoins < 0 || *awaitJoins > 255 {
		return errors.New("-await-joins must be in [0, 255]")
	}
	if *awaitAfter < 0 {
		return errors.New("-await-after must not be negative")
	}
	joins := joinWait{want: *awaitJoins, timeout: *awaitTimeout, after: max(*awaitAfter, stream.PreambleLen)}

	reports := make([]SenderReport, *conns)
	var wg sync.WaitGroup
	for i := range *conns {
		wg.Add(1)
		one := func() {
			defer wg.Done()
			dial := dialMode{mptcp: *mptcp, goDefault: *goDefault}
			reports[i] = sendOne(*to, dial, *cc, *seed, i, *duration, *stall, *nbytes, *rate*1e6/8, joins)
		}
		if *serial {
			one()
		} else {
			go one()
		}
	}
	wg.Wait()
	failed := false
	for _, r := range reports {
		if r.Error != "" {
			failed = true
		}
		if *asJSON {
			line, _ := json.Marshal(r)
			fmt.Println(string(line))
		} else {
			fmt.Printf("conn %d %s -> %s mptcp=%v bytes=%d %.1f Mbit/s sha256=%s %s\n", r.Conn, r.Local, r.Remote,
				r.MPTCP, r.Bytes, float64(r.Bytes)*8/r.Seconds/1e6, r.SHA256, r.Error)
		}
	}
	if failed {
		return errors.New("some connections failed")
	}
	return nil
}

// congestionControl reads a connection's TCP_CONGESTION (an MPTCP
// socket answers for its first subflow).
func congestionControl(c *net.TCPConn) (string, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return "", err
	}
	var name string
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		name, gerr = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	}); err != nil {
		return "", err
	}
	return name, gerr
}

// dialMode says whether a connection asks for MPTCP: mptcp, or, with
// goDefault, not at all (Go's default decides).
type dialMode struct{ mptcp, goDefault bool }

// sendOne sends one connection's stream; pace, in bytes per second, holds
// the bytes written by each moment to that rate (0: no pacing).
func sendOne(to string, dial dialMode, cc string, seed uint64, i int, duration, stall time.Duration, nbytes int64, pace float64, joins joinWait) SenderReport {
	r := SenderReport{Conn: i, Seed: seed, Remote: to}
	var d net.Dialer
	if !dial.goDefault {
		d.SetMultipathTCP(dial.mptcp)
	}
	if cc != "" {
		// Before connect, so that every subflow starts with it (an
		// MPTCP socket hands TCP_CONGESTION to its subflows).
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc)
			}); err != nil {
				return err
			}
			if serr != nil {
				return fmt.Errorf("congestion control %q: %w", cc, serr)
			}
			return nil
		}
	}
	start := time.Now()
	c, err := d.Dial("tcp", to)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	tc := c.(*net.TCPConn)
	r.Local = c.LocalAddr().String()
	r.MPTCP, _ = tc.MultipathTCP()
	if cc != "" {
		// An MPTCP socket keeps the name before connect and its subflows
		// apply it without loading a module: read back what the first
		// subflow runs.
		if got, err := congestionControl(tc); err != nil || got != cc {
			_ = c.Close()
			r.Error = fmt.Sprintf("congestion control %q asked, the connection runs %q (%v)", cc, got, err)
			return r
		}
	}
	h := newBlockHasher()
	src := stream.Whole(seed, i)
	if r.MPTCP && joins.want > 0 {
		// The preamble first (or the bytes the path manager waits
		// for), and nothing more until the joins are up: a connection
		// is fully established, and a path manager opens its joins,
		// once the peer has acknowledged data.
		first := make([]byte, max(joins.after, stream.PreambleLen))
		_, _ = io.ReadFull(src, first)
		w, err := c.Write(first)
		h.Write(first[:w])
		r.Bytes += int64(w)
		if err != nil {
			r.Error = err.Error()
			_ = c.Close()
			r.SHA256, r.Blocks = h.sums()
			return r
		}
		r.JoinsAwaited, r.JoinWaitTimedOut = joins.await(tc)
		start = time.Now() // the stream's bulk, and its duration, start now
	}
	buf := make([]byte, 128<<10)
	if pace > 0 {
		// Smaller writes keep a paced connection smooth: 16 KiB is
		// 1.3 ms at 100 Mbit/s.
		buf = buf[:16<<10]
	}
	deadline := start.Add(duration)
	for {
		if pace > 0 {
			if ahead := float64(r.Bytes)/pace - time.Since(start).Seconds(); ahead > 0 {
				time.Sleep(time.Duration(ahead * float64(time.Second)))
			}
		}
		n := len(buf)
		if nbytes > 0 {
			if left := nbytes - r.Bytes; left < int64(n) {
				n = int(left)
			}
			if n == 0 {
				break
			}
		} else if time.Now().After(deadline) {
			break
		}
		_, _ = io.ReadFull(src, buf[:n])
		// A stall is a write that makes no progress for a while, not a
		// transfer that outlives its duration: an MPTCP socket's send
		// buffer grows to several subflows' worth and may hold seconds of
		// data at a capped rate, which drain after the last write.
		_ = c.SetWriteDeadline(time.Now().Add(stall))
		w, err := c.Write(buf[:n])
		h.Write(buf[:w])
		r.Bytes += int64(w)
		if err != nil {
			r.Error = err.Error()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				r.Error = fmt.Sprintf("no progress for %v: %v", stall, err)
			}
			break
		}
	}
	// Half-close and wait for the server's close, so that the server has read everything when we report.
	_ = tc.CloseWrite()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, _ = io.Copy(io.Discard, c)
	c.Close()
	r.Seconds = time.Since(start).Seconds()
	r.SHA256, r.Blocks = h.sums()
	return r
}

// echo answers every UDP datagram with itself.
func echo(args []string) error {
	fs := flag.NewFlagSet("echo", flag.ExitOnError)
	listen := fs.String("listen", ":7", "UDP address to listen on")
	_ = fs.Parse(args)
	c, err := net.ListenPacket("udp", *listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "listening on %s\n", c.LocalAddr())
	buf := make([]byte, 2048)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return err
		}
		_, _ = c.WriteTo(buf[:n], from)
	}
}

// ProbeReport is the output of probe.
type ProbeReport struct {
	Sent     int `json:"sent"`
	Received int `json:"received"`
}

// probe sends numbered UDP datagrams to an echo server and counts the distinct ones that come back in time.
func probe(args []string) error {
	fs := flag.NewFlagSet("probe", flag.ExitOnError)
	to := fs.String("to", "", "echo server address")
	count := fs.Int("count", 100, "datagrams to send")
	interval := fs.Duration("interval", 2*time.Millisecond, "time between datagrams")
	wait := fs.Duration("wait", time.Second, "how long to wait for replies after the last datagram")
	_ = fs.Parse(args)
	c, err := net.Dial("udp", *to)
	if err != nil {
		return err
	}
	defer c.Close()
	seen := make([]bool, *count)
	var mu sync.Mutex
	received := 0
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := c.Read(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue // e.g. ECONNREFUSED from an ICMP error before the echo server started
			}
			if n >= 4 {
				i := int(binary.BigEndian.Uint32(buf))
				mu.Lock()
				if i < len(seen) && !seen[i] {
					seen[i] = true
					received++
				}
				mu.Unlock()
			}
		}
	}()
	msg := make([]byte, 64)
	for i := range *count {
		binary.BigEndian.PutUint32(msg, uint32(i))
		_, _ = c.Write(msg)
		time.Sleep(*interval)
	}
	time.Sleep(*wait)
	mu.Lock()
	r := ProbeReport{Sent: *count, Received: received}
	mu.Unlock()
	line, _ := json.Marshal(r)
	fmt.Println(string(line))
	return nil
}
