package metrics

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net/http"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/mptcp-operator/mptcp-operator/internal/metricsauth"
)

// MaxScrapesInFlight is how many scrapes the controller answers at once;
// more get 503 at once. Prometheus sends one per target and interval (two
// with a pair of replicas), so only a flood reaches it, and then at most
// this many goroutines encode metrics beside the reconciles.
const MaxScrapesInFlight = 4

// Serving is how the controller serves /metrics.
type Serving struct {
	// BindAddress is the address to listen on; "0" serves nothing.
	BindAddress string
	// Auth serves over TLS and answers /metrics only to callers the API
	// server authenticates and allows to get the non-resource URL
	// /metrics (internal/metricsauth, as the agents do).
	Auth bool
	// CertDir holds tls.crt and tls.key, read again when they change;
	// empty: a self-signed certificate made at start.
	CertDir string
	// Log gets what the reviews log.
	Log *slog.Logger
}

// ServerOptions are controller-runtime's metrics server options for s:
// its own server and TLS, with a filter that reviews scrapers (with Auth)
// and then bounds the scrapes in flight.
func ServerOptions(s Serving) (metricsserver.Options, error) {
	o := metricsserver.Options{
		BindAddress: s.BindAddress,
		FilterProvider: func(cfg *rest.Config, _ *http.Client) (metricsserver.Filter, error) {
			var guard *metricsauth.Guard
			if s.Auth {
				var err error
				if guard, err = metricsauth.NewGuard(cfg, s.Log); err != nil {
					return nil, err
				}
			}
			return func(_ logr.Logger, h http.Handler) (http.Handler, error) {
				// The bound inside the review: refused scrapers
				// never take a scraper's place.
				h = bounded(h, MaxScrapesInFlight)
				if guard != nil {
					h = guard.Require(h)
				}
				return h, nil
			}, nil
		},
	}
	if !s.Auth {
		return o, nil
	}
	o.SecureServing = true
	o.CertDir = s.CertDir
	var selfSigned *tls.Certificate
	if s.CertDir == "" {
		// Made here rather than left to controller-runtime, which
		// would first look for a certificate in a directory of its
		// own under the temporary directory.
		cfg, err := metricsauth.TLSConfig(context.Background(), "", "mptcp-controller", s.Log)
		if err != nil {
			return o, err
		}
		selfSigned = &cfg.Certificates[0]
	}
	o.TLSOpts = []func(*tls.Config){func(c *tls.Config) {
		c.MinVersion = tls.VersionTLS12
		// HTTP/1.1 only: HTTP/2 would let one connection carry many
		// requests at once, and its stream resets cost the server work
		// that no limit on requests sees.
		c.NextProtos = []string{"http/1.1"}
		if selfSigned != nil {
			c.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return selfSigned, nil }
		}
	}}
	return o, nil
}

// bounded serves h to at most n requests at once, and 503 to the others
// (as promhttp's MaxRequestsInFlight does) rather than queueing them.
func bounded(h http.Handler, n int) http.Handler {
	slots := make(chan struct{}, n)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
			h.ServeHTTP(w, r)
		default:
			w.Header().Set("Retry-After", "1")
			http.Error(w, "too many scrapes at once; retry later", http.StatusServiceUnavailable)
		}
	})
}
