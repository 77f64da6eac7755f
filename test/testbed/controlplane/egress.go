package controlplane

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// The API server runs in the machine's network namespace, where no bed
// address is routed, yet `kubectl logs`, exec and port-forward have it dial
// the kubelet at a Node's address, and a webhook or an aggregated API served
// by a pod has it dial the pod. Clusters whose control plane cannot route to
// nodes solve this with the API server's egress selector and a proxy on the
// far side (Konnectivity); here the proxy is in this process: an HTTP
// CONNECT proxy on a unix socket (no port on the machine) that dials each
// address from inside the bed namespace that holds it (RouteToNode). The
// API server's "cluster" egress goes through it.

// egressProxy is that proxy.
type egressProxy struct {
	ln  net.Listener
	dir string // holds the socket
	wg  sync.WaitGroup

	mu     sync.Mutex
	routes []egressRoute
	conns  map[net.Conn]struct{}
	closed bool
}

// egressRoute says which network namespace reaches a prefix.
type egressRoute struct {
	prefix netip.Prefix
	netns  string // a name under /var/run/netns
}

func startEgressProxy() (*egressProxy, error) {
	// A short directory of its own: a socket's path must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "egress-")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "proxy.sock"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p := &egressProxy{ln: ln, dir: dir, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// writeConfig writes the API server's EgressSelectorConfiguration: cluster
// traffic through the proxy, the rest (etcd, the control plane's own) direct.
func (p *egressProxy) writeConfig(dir string) (string, error) {
	path := filepath.Join(dir, "egress-selector.yaml")
	conf := fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
`, p.ln.Addr())
	return path, os.WriteFile(path, []byte(conf), 0o600)
}

func (p *egressProxy) addRoute(netns string, prefixes ...netip.Prefix) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range prefixes {
		p.routes = append(p.routes, egressRoute{prefix: pr.Masked(), netns: netns})
	}
}

// namespaceOf is the namespace whose route to addr is the most specific.
func (p *egressProxy) namespaceOf(addr netip.Addr) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	best, bits := "", -1
	for _, r := range p.routes {
		if r.prefix.Contains(addr) && r.prefix.Bits() > bits {
			best, bits = r.netns, r.prefix.Bits()
		}
	}
	return best
}

func (p *egressProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

// handle answers one CONNECT: dial the target from its namespace, say so,
// then copy both ways.
func (p *egressProxy) handle(c net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if req.Method != http.MethodConnect {
		fmt.Fprintf(c, "HTTP/1.1 405 Method Not Allowed\r\n\r\n")
		return
	}
	up, err := p.dial(req.Host)
	if err != nil {
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\n\r\n%v\n", err)
		return
	}
	defer up.Close()
	if !p.track(c, up) {
		return
	}
	defer p.untrack(c, up)
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(up, br) // br holds what the client sent after the request
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(c, up)
		done <- struct{}{}
	}()
	<-done
}

func (p *egressProxy) dial(hostport string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return nil, fmt.Errorf("%s: the egress proxy dials addresses only: %w", hostport, err)
	}
	ns := p.namespaceOf(addr)
	if ns == "" {
		return nil, fmt.Errorf("no bed namespace routes %s", addr)
	}
	var conn net.Conn
	err = netnsutil.Do("/var/run/netns/"+ns, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", hostport, 10*time.Second)
		return err
	})
	return conn, err
}

func (p *egressProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *egressProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// close stops listening, ends open tunnels and waits for them.
func (p *egressProxy) close() {
	if p == nil {
		return
	}
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	if err == nil || errors.Is(err, net.ErrClosed) {
		p.wg.Wait()
	}
	os.RemoveAll(p.dir)
}
