package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/mptcp-operator/mptcp-operator/hack/traffic/stream"
)

// blast and sink move a cheap stream: one pseudo-random block of
// blastBlock bytes sent over and over, which the sink compares with the
// block it expects at every offset. send and serve generate, hash and
// check every byte of a stream that never repeats, which costs more CPU
// than a VM guest under software emulation has (it sends about 45 Mbit/s
// so); blast and sink cost a copy and a compare per byte. A changed byte
// still fails the transfer (the sink reports where), but a byte moved by a
// multiple of the block would not: the integrity tests use send and
// serve, the VM benchmark blast and sink.
const blastBlock = 1 << 20

// blastPattern is the block: the start of the payload of stream (seed 1,
// connection 0).
func blastPattern() []byte {
	b := make([]byte, blastBlock)
	_, _ = io.ReadFull(stream.Payload(1, 0), b)
	return b
}

// SinkReport is the line sink writes per connection.
type SinkReport struct {
	Local, Remote string
	MPTCP         bool    `json:"mptcp"`
	Bytes         int64   `json:"bytes"`
	GoodputBps    float64 `json:"goodput_bps"`
	WindowSeconds float64 `json:"window_s"`
	// Changed is the offset of the first byte that differed from the
	// pattern; -1 when none did.
	Changed int64  `json:"changed"`
	Error   string `json:"error,omitempty"`
}

func blast(args []string) error {
	fs := flag.NewFlagSet("blast", flag.ExitOnError)
	to := fs.String("to", "", "sink address")
	mptcp := fs.Bool("mptcp", false, "dial with MPTCP")
	duration := fs.Duration("duration", 10*time.Second, "how long to send")
	_ = fs.Parse(args)
	if *to == "" {
		return errors.New("-to is required")
	}
	var d net.Dialer
	d.SetMultipathTCP(*mptcp)
	c, err := d.Dial("tcp", *to)
	if err != nil {
		return err
	}
	defer c.Close()
	pattern := blastPattern()
	end := time.Now().Add(*duration)
	// A sink that stops reading ends the blast instead of hanging it.
	if err := c.SetDeadline(end.Add(30 * time.Second)); err != nil {
		return err
	}
	var sent int64
	for time.Now().Before(end) {
		n, err := c.Write(pattern)
		sent += int64(n)
		if err != nil {
			return fmt.Errorf("after %d bytes: %w", sent, err)
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	// The sink closes once it has read everything.
	_, _ = io.Copy(io.Discard, c)
	fmt.Printf("{\"bytes\":%d}\n", sent)
	return nil
}

func sink(args []string) error {
	fs := flag.NewFlagSet("sink", flag.ExitOnError)
	listen := fs.String("listen", ":5201", "address to listen on")
	mptcp := fs.Bool("mptcp", false, "listen with MPTCP")
	warmup := fs.Duration("warmup", 2*time.Second, "time after the first byte that goodput ignores")
	window := fs.Duration("window", 5*time.Second, "length of the goodput window")
	count := fs.Int("conns", 1, "connections to take, one after the other, before exiting")
	_ = fs.Parse(args)
	var lc net.ListenConfig
	lc.SetMultipathTCP(*mptcp)
	ln, err := lc.Listen(context.Background(), "tcp", *listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Fprintf(os.Stderr, "listening on %s mptcp=%v\n", ln.Addr(), *mptcp)
	pattern := blastPattern()
	enc := json.NewEncoder(os.Stdout)
	for range *count {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		r := drainChecked(c.(*net.TCPConn), pattern, *warmup, *window)
		_ = c.Close()
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// drainChecked reads c to its end, comparing every byte with pattern.
func drainChecked(c *net.TCPConn, pattern []byte, warmup, window time.Duration) SinkReport {
	r := SinkReport{Local: c.LocalAddr().String(), Remote: c.RemoteAddr().String(), Changed: -1}
	r.MPTCP, _ = c.MultipathTCP()
	buf := make([]byte, 256<<10)
	gw := newGoodputWindow(warmup, window)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			gw.add(time.Now(), r.Bytes, r.Bytes+int64(n))
			if r.Changed < 0 {
				r.Changed = firstDifference(buf[:n], pattern, r.Bytes)
			}
			r.Bytes += int64(n)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				r.Error = err.Error()
			}
			break
		}
	}
	if gw.first.IsZero() {
		r.Error = "no byte arrived"
		return r
	}
	_, r.WindowSeconds, r.GoodputBps, _ = gw.measure(time.Now(), r.Bytes)
	if gw.endBytes < 0 {
		r.Error = fmt.Sprintf("the stream (%d bytes) ended inside the warm-up and window", r.Bytes)
	}
	return r
}

// firstDifference returns the stream offset of the first byte of p (which
// starts at offset off) that differs from the repeated pattern, or -1.
func firstDifference(p, pattern []byte, off int64) int64 {
	for len(p) > 0 {
		at := int(off % int64(len(pattern)))
		n := min(len(p), len(pattern)-at)
		if !bytes.Equal(p[:n], pattern[at:at+n]) {
			for i := range n {
				if p[i] != pattern[at+i] {
					return off + int64(i)
				}
			}
		}
		p, off = p[n:], off+int64(n)
	}
	return -1
}
