package controlplane

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"runtime"
	"sync"

	"github.com/vishvananda/netns"
)

// Relay makes the API server reachable from inside a bed namespace. The API
// server listens on 127.0.0.1 of the machine's namespace, which an agent in a
// node namespace cannot reach, and the bed may not add links or routes to the
// machine's namespace. So the relay opens a listening socket on the same
// address and port inside the node namespace (a socket stays in the
// namespace it was created in) and copies each connection to the API server
// from this process. The kubeconfig needs no change: same URL, and the
// server's certificate is valid for 127.0.0.1.
type Relay struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// RelayInto starts a relay for the API server into network namespace ns
// (a name under /var/run/netns). Stop closes it.
func (cp *ControlPlane) RelayInto(ns string) (*Relay, error) {
	u, err := url.Parse(cp.Env.Config.Host)
	if err != nil {
		return nil, fmt.Errorf("API server address: %w", err)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("API server address %q has no host", cp.Env.Config.Host)
	}
	ln, err := listenIn(ns, u.Host)
	if err != nil {
		return nil, err
	}
	r := &Relay{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.serve()
	cp.relays = append(cp.relays, r)
	return r, nil
}

// listenIn listens on addr inside namespace ns. The thread switches
// namespace only for the socket call; if it cannot switch back it stays
// locked, and Go retires it when the goroutine ends.
func listenIn(ns, addr string) (net.Listener, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer orig.Close()
	target, err := netns.GetFromName(ns)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("namespace %s: %w", ns, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter %s: %w", ns, err)
	}
	ln, lerr := net.Listen("tcp", addr)
	if err := netns.Set(orig); err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, fmt.Errorf("leave %s: %w", ns, err)
	}
	runtime.UnlockOSThread()
	if lerr != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", addr, ns, lerr)
	}
	return ln, nil
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
