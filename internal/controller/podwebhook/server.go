package podwebhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

const (
	// maxHeaderBytes bounds a request's headers. The API server sends a few
	// short ones (no more than a bearer token where its admission
	// configuration gives one); net/http's default, and controller-runtime's,
	// is 1 MiB, which each waiting request and each connection still
	// sending its headers would hold.
	maxHeaderBytes = 32 << 10
	// headerTimeout is how long a connection may take for its TLS handshake
	// and a request's headers (net/http bounds the handshake by it too): the
	// API server sends them at once; controller-runtime's 32 s let a slow
	// sender hold a connection and its headers that long.
	headerTimeout = 5 * time.Second
	// idleTimeout is how long a kept-alive connection waits for its next
	// request, as controller-runtime's server does.
	idleTimeout = 90 * time.Second
)

// server is controller-runtime's webhook server with an http.Server of its
// own. controller-runtime (v0.24) builds its http.Server inside Start with
// 1 MiB headers and a 32 s header timeout, and neither webhook.Options nor
// the listener can change that: a listener cannot tell headers from a
// body. Registering stays controller-runtime's (its request metrics
// included); Start serves the same mux, over the same TLS, with small
// header bounds.
type server struct {
	*webhook.DefaultServer
	host    string
	port    int
	tlsOpts []func(*tls.Config)
	mux     *http.ServeMux
	started atomic.Bool
}

var _ webhook.Server = (*server)(nil)

func newServer(host string, port int, tlsOpts ...func(*tls.Config)) *server {
	if port <= 0 {
		port = webhook.DefaultPort
	}
	mux := http.NewServeMux()
	return &server{
		DefaultServer: webhook.NewServer(webhook.Options{Host: host, Port: port, TLSOpts: tlsOpts, WebhookMux: mux}).(*webhook.DefaultServer),
		host:          host, port: port, tlsOpts: tlsOpts, mux: mux,
	}
}

// Start serves the registered webhooks until ctx ends.
func (s *server) Start(ctx context.Context) error {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	for _, op := range s.tlsOpts {
		op(cfg)
	}
	if cfg.GetCertificate == nil && len(cfg.Certificates) == 0 {
		return errors.New("webhook server: no certificate")
	}
	ln, err := tls.Listen("tcp", net.JoinHostPort(s.host, strconv.Itoa(s.port)), cfg)
	if err != nil {
		return err
	}
	srv := &http.Server{
		BaseContext:       func(net.Listener) context.Context { return ctx },
		Handler:           s.mux,
		MaxHeaderBytes:    maxHeaderBytes,
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       idleTimeout,
	}
	closed := make(chan error, 1)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		closed <- srv.Shutdown(sctx)
	}()
	s.started.Store(true)
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	if err := <-closed; err != nil {
		return fmt.Errorf("webhook server shutdown: %w", err)
	}
	return nil
}

// StartedChecker is healthy once Start serves and the port accepts a TLS
// connection (DefaultServer's would never see this Start). With client
// certificates required, the server's alert refusing the checker's
// handshake is an answer too.
func (s *server) StartedChecker() healthz.Checker {
	return func(*http.Request) error {
		if !s.started.Load() {
			return errors.New("webhook server has not been started yet")
		}
		d := &net.Dialer{Timeout: 10 * time.Second}
		//nolint:gosec // only whether the port answers TLS is checked
		conn, err := tls.DialWithDialer(d, "tcp", net.JoinHostPort(s.host, strconv.Itoa(s.port)), &tls.Config{InsecureSkipVerify: true})
		if refusedAtTLS(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("webhook server is not reachable: %w", err)
		}
		return conn.Close()
	}
}

// refusedAtTLS tells whether err is the TLS alert of a peer that refused
// the handshake (crypto/tls reports a received alert as a "remote error").
func refusedAtTLS(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}
