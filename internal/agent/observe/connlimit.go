package observe

import (
	"net"
	"net/netip"
	"sync"
)

// connsPerSource is how many connections one remote address may hold open
// to the agent's HTTP port at once: Prometheus and the kubelet's probes
// need one or two each; a source that opens connections and leaves them
// idle fills only its own share.
const connsPerSource = 16

// perSourceListener accepts at most max connections open at once from one
// remote address (an IPv6 /64: one host's addresses), and closes the others
// as they come.
type perSourceListener struct {
	net.Listener
	max  int
	mu   sync.Mutex
	open map[netip.Addr]int
}

func limitPerSource(ln net.Listener, max int) net.Listener {
	return &perSourceListener{Listener: ln, max: max, open: map[netip.Addr]int{}}
}

func (l *perSourceListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		var src netip.Addr
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			src = a.AddrPort().Addr().Unmap()
			if src.Is6() {
				src = netip.PrefixFrom(src, 64).Masked().Addr()
			}
		}
		l.mu.Lock()
		if l.open[src] >= l.max {
			l.mu.Unlock()
			_ = c.Close()
			continue
		}
		l.open[src]++
		l.mu.Unlock()
		return &countedConn{Conn: c, release: sync.OnceFunc(func() { l.release(src) })}, nil
	}
}

func (l *perSourceListener) release(src netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[src]--; l.open[src] <= 0 {
		delete(l.open, src)
	}
}

// countedConn gives its place back to its source when it closes.
type countedConn struct {
	net.Conn
	release func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
