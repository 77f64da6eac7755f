package testbed

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// Relay makes a server on the machine's loopback (the test API server)
// reachable from inside a bed namespace, whose loopback is its own; the bed
// may not add links or routes to the machine's namespace. The relay opens a
// listening socket on the same address and port inside the node namespace
// and copies each connection to the server from this process. A kubeconfig
// needs no change: same URL, and the server's certificate is valid for
// 127.0.0.1.
type Relay struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// StartRelay relays connections made to addr inside network namespace ns (a
// name under /var/run/netns) to addr as this process sees it. Close stops it.
func StartRelay(ns, addr string) (*Relay, error) {
	return StartRelayTo(ns, addr, addr)
}

// StartRelayTo relays connections made to listen inside network namespace ns
// to target as this process sees it: e.g. the kubernetes Service address on a
// node to the API server on the machine's loopback, which is what kube-proxy
// would do. listen's address must exist in ns.
func StartRelayTo(ns, listen, target string) (*Relay, error) {
	var ln net.Listener
	// A socket stays in the namespace of the thread that created it.
	err := netnsutil.Do("/var/run/netns/"+ns, func() error {
		var err error
		ln, err = net.Listen("tcp", listen)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", listen, ns, err)
	}
	r := &Relay{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

func (r *Relay) serve() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go r.pipe(c)
	}
}

func (r *Relay) pipe(c net.Conn) {
	defer r.wg.Done()
	up, err := net.Dial("tcp", r.target)
	if err != nil {
		c.Close()
		return
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	r.conns[c], r.conns[up] = struct{}{}, struct{}{}
	r.mu.Unlock()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(up, c)
	go cp(c, up)
	<-done
	c.Close()
	up.Close()
	<-done
	r.mu.Lock()
	delete(r.conns, c)
	delete(r.conns, up)
	r.mu.Unlock()
}

// Close stops listening, ends open connections and waits for the relay's
// goroutines.
func (r *Relay) Close() {
	err := r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	if err == nil || errors.Is(err, net.ErrClosed) {
		r.wg.Wait()
	}
}
