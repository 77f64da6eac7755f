// Package metricsauth puts a component's /metrics behind the API server's
// authentication and authorization, as kube-rbac-proxy does in front of
// other exporters, without a sidecar: it asks the API server who a
// scraper's bearer token belongs to (TokenReview) and whether that user may
// get the non-resource URL /metrics (SubjectAccessReview), and serves over
// TLS so that the tokens scrapers send do not cross the network in clear.
// The agent serves it itself; the controller puts it in controller-runtime's
// metrics server as a filter.
//
// The API server makes both decisions; this package only asks and obeys.
// It uses client-go's typed clients, which both binaries link anyway, rather
// than controller-runtime's metrics filter: that filter's k8s.io/apiserver
// authenticators pull gRPC, OpenTelemetry and CEL into the binary, and
// bound neither the reviews a flood of new tokens asks for nor who spends
// them (docs/security.md).
//
// The probes (/healthz, /readyz) stay open: the kubelet probes without
// credentials, and they say nothing about anyone's traffic.
package metricsauth

import (
	"container/list"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// MetricsPath is the one path that needs credentials; callers need get on
// this non-resource URL.
const MetricsPath = "/metrics"

// Certificate and key file names in a certificate directory (those of a
// kubernetes.io/tls Secret).
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// How long a review's answer is reused and how many answers are kept. A
// scraper comes back every 15-60 s with the same token, so its reviews cost
// the API server two requests a minute per node.
const (
	allowTTL      = time.Minute
	denyTTL       = 10 * time.Second
	maxCached     = 1024
	reviewTimeout = 10 * time.Second
)

// How many reviews of tokens not in the cache a guard asks for. A client
// that sends a new token on every request (nothing but an attacker does)
// gets 429 beyond these rates, so a guard cannot be used to flood the API
// server with reviews, and one address cannot use up the reviews that other
// scrapers need:
//
//   - each source address has its own budget (sourceReviewsPerSec, burst
//     sourceReviewBurst), kept for the maxSources addresses seen last;
//   - addresses that have not shown a token the API server authorized in the
//     last readerTTL share one more (reviewsPerSec, burst reviewBurst), so
//     that many addresses flooding together still reach the API server at a
//     bounded rate;
//   - an address that has shown an authorized token in the last readerTTL (a
//     scraper, whose token the kubelet replaces every hour or so) skips the
//     shared budget: a flood from other addresses cannot keep its next token
//     from being reviewed. At most maxReaders such addresses are kept, and
//     only an authorized token makes one.
const (
	sourceReviewsPerSec = 1
	sourceReviewBurst   = 5
	maxSources          = 4096
	reviewsPerSec       = 5
	reviewBurst         = 10
	readerTTL           = 10 * time.Minute
	maxReaders          = 256
)

// Guard serves MetricsPath to authorized callers only.
type Guard struct {
	tokens authenticationclient.TokenReviewsGetter
	access authorizationclient.SubjectAccessReviewsGetter
	log    *slog.Logger
	now    func() time.Time

	mu    sync.Mutex
	cache map[[sha256.Size]byte]verdict
	// shared is the budget of the addresses that are no reader's.
	shared *rate.Limiter
	// sources are the budgets of the addresses seen last.
	sources *sourceBudgets
	// readers are the addresses that showed an authorized token, and
	// until when they count as a reader's.
	readers map[netip.Addr]time.Time
}

// verdict is a cached answer for one token (kept by its hash, never the
// token itself).
type verdict struct {
	status  int // http.StatusOK, StatusUnauthorized or StatusForbidden
	user    string
	expires time.Time
}

// NewGuard makes the reviews with cfg: the component's own credentials,
// which need create on tokenreviews and subjectaccessreviews.
func NewGuard(cfg *rest.Config, log *slog.Logger) (*Guard, error) {
	if cfg == nil {
		return nil, errors.New("metrics authentication needs the API server")
	}
	tokens, err := authenticationclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("metrics authentication: %w", err)
	}
	access, err := authorizationclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("metrics authentication: %w", err)
	}
	return &Guard{
		tokens: tokens, access: access, log: log, now: time.Now,
		cache:   map[[sha256.Size]byte]verdict{},
		shared:  rate.NewLimiter(reviewsPerSec, reviewBurst),
		sources: newSourceBudgets(maxSources),
		readers: map[netip.Addr]time.Time{},
	}, nil
}

// Handler returns h with MetricsPath served only to callers the API server
// authenticates and authorizes; h's other paths are served to anyone.
func (g *Guard) Handler(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(MetricsPath, g.Require(h))
	mux.Handle("/", h)
	return mux
}

// Require returns h served only to callers the API server authenticates and
// allows to get MetricsPath, whatever the path asked for: the filter of a
// server that serves nothing else.
func (g *Guard) Require(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "only GET", http.StatusMethodNotAllowed)
			return
		}
		token, ok := bearer(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", realm)
			http.Error(w, "a bearer token is needed", http.StatusUnauthorized)
			return
		}
		v, err := g.review(r.Context(), token, remoteAddr(r))
		switch {
		case errors.Is(err, errTooManyReviews):
			w.Header().Set("Retry-After", "1")
			http.Error(w, err.Error(), http.StatusTooManyRequests)
			return
		case err != nil:
			g.log.Warn("metrics: the API server could not review a scraper", "err", err)
			http.Error(w, "the API server could not review the request", http.StatusServiceUnavailable)
			return
		}
		switch v.status {
		case http.StatusOK:
			h.ServeHTTP(w, r)
		case http.StatusUnauthorized:
			w.Header().Set("WWW-Authenticate", realm)
			http.Error(w, "the token is not valid", http.StatusUnauthorized)
		default:
			http.Error(w, fmt.Sprintf("%s may not get %s", v.user, MetricsPath), http.StatusForbidden)
		}
	})
}

// realm is the WWW-Authenticate challenge of a refusal.
const realm = `Bearer realm="mptcp-operator"`

// bearer returns the token of an "Authorization: Bearer" header.
func bearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", false
	}
	return token, true
}

// remoteAddr is the address r came from: its connection's, never a header
// the client writes.
func remoteAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{} // one budget for whatever cannot be told apart
	}
	return ap.Addr().Unmap()
}

var errTooManyReviews = errors.New("too many requests with new credentials; retry later")

// review answers from the cache or asks the API server, within from's
// budget. An error (the API server unreachable) is never cached and never
// allows.
func (g *Guard) review(ctx context.Context, token string, from netip.Addr) (verdict, error) {
	key := sha256.Sum256([]byte(token))
	now := g.now()
	g.mu.Lock()
	if v, ok := g.cache[key]; ok && now.Before(v.expires) {
		if v.status == http.StatusOK {
			g.markReader(from, now)
		}
		g.mu.Unlock()
		return v, nil
	}
	allowed := g.allowReview(from, now)
	g.mu.Unlock()
	if !allowed {
		return verdict{}, errTooManyReviews
	}
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	v, err := g.ask(ctx, token)
	if err != nil {
		return verdict{}, err
	}
	v.expires = now.Add(denyTTL)
	if v.status == http.StatusOK {
		v.expires = now.Add(allowTTL)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if v.status == http.StatusOK {
		g.markReader(from, now)
	}
	if len(g.cache) >= maxCached {
		// Expired answers go first, then refusals: forged tokens
		// must not push out the answers scrapers reuse.
		for k, old := range g.cache {
			if !now.Before(old.expires) {
				delete(g.cache, k)
			}
		}
		for k, old := range g.cache {
			if len(g.cache) < maxCached {
				break
			}
			if old.status != http.StatusOK {
				delete(g.cache, k)
			}
		}
		if len(g.cache) >= maxCached {
			clear(g.cache)
		}
	}
	g.cache[key] = v
	return v, nil
}

// allowReview takes a review from from's budget and, unless from is a
// reader's, from the shared one. g.mu is held.
func (g *Guard) allowReview(from netip.Addr, now time.Time) bool {
	// The address's own budget first: what it refuses costs the shared
	// budget nothing, so one address takes at most its own rate of it.
	if !g.sources.get(from).AllowN(now, 1) {
		return false
	}
	if until, ok := g.readers[from]; ok && now.Before(until) {
		return true
	}
	return g.shared.AllowN(now, 1)
}

// markReader records that from showed an authorized token at now. g.mu is
// held.
func (g *Guard) markReader(from netip.Addr, now time.Time) {
	if _, ok := g.readers[from]; !ok && len(g.readers) >= maxReaders {
		// Room for a new reader: the expired ones go, else the one
		// seen longest ago.
		var oldest netip.Addr
		var oldestUntil time.Time
		for a, until := range g.readers {
			if !now.Before(until) {
				delete(g.readers, a)
			} else if oldestUntil.IsZero() || until.Before(oldestUntil) {
				oldest, oldestUntil = a, until
			}
		}
		if len(g.readers) >= maxReaders {
			delete(g.readers, oldest)
		}
	}
	g.readers[from] = now.Add(readerTTL)
}

// sourceBudgets are review budgets per source address, for the max
// addresses used last: an address forgotten gets a full budget again when
// it comes back, which the shared budget still bounds.
type sourceBudgets struct {
	max    int
	byAddr map[netip.Addr]*list.Element // of *sourceBudget
	lru    *list.List                   // most recently used first
}

type sourceBudget struct {
	addr    netip.Addr
	limiter *rate.Limiter
}

func newSourceBudgets(limit int) *sourceBudgets {
	return &sourceBudgets{max: limit, byAddr: map[netip.Addr]*list.Element{}, lru: list.New()}
}

// get returns addr's budget, made full if addr has none.
func (s *sourceBudgets) get(addr netip.Addr) *rate.Limiter {
	if e, ok := s.byAddr[addr]; ok {
		s.lru.MoveToFront(e)
		return e.Value.(*sourceBudget).limiter
	}
	if s.lru.Len() >= s.max {
		last := s.lru.Back()
		s.lru.Remove(last)
		delete(s.byAddr, last.Value.(*sourceBudget).addr)
	}
	b := &sourceBudget{addr: addr, limiter: rate.NewLimiter(sourceReviewsPerSec, sourceReviewBurst)}
	s.byAddr[addr] = s.lru.PushFront(b)
	return b.limiter
}

// ask makes the TokenReview, then the SubjectAccessReview of its user.
func (g *Guard) ask(ctx context.Context, token string) (verdict, error) {
	tr, err := g.tokens.TokenReviews().Create(ctx,
		&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return verdict{}, fmt.Errorf("token review: %w", err)
	}
	if !tr.Status.Authenticated {
		return verdict{status: http.StatusUnauthorized}, nil
	}
	u := tr.Status.User
	extra := make(map[string]authorizationv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := g.access.SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: MetricsPath, Verb: "get"},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return verdict{}, fmt.Errorf("subject access review: %w", err)
	}
	if !sar.Status.Allowed || sar.Status.Denied {
		return verdict{status: http.StatusForbidden, user: u.Username}, nil
	}
	return verdict{status: http.StatusOK, user: u.Username}, nil
}

// TLSConfig serves the certificate and key in certDir, read again whenever
// they change (a renewed Secret), until ctx ends; with certDir empty, a
// self-signed certificate for host made now, which scrapers cannot verify:
// they must be told to skip verification, and then send their token to
// whoever answers on the server's address.
func TLSConfig(ctx context.Context, certDir, host string, log *slog.Logger) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if certDir == "" {
		certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, nil)
		if err != nil {
			return nil, fmt.Errorf("self-signed metrics certificate: %w", err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("self-signed metrics certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
		return cfg, nil
	}
	certPath, keyPath := filepath.Join(certDir, CertFile), filepath.Join(certDir, KeyFile)
	for _, p := range []string{certPath, keyPath} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("metrics certificate: %w", err)
		}
	}
	w, err := certwatcher.New(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("metrics certificate: %w", err)
	}
	go func() {
		if err := w.Start(ctx); err != nil {
			log.Error("watching the metrics certificate", "err", err)
		}
	}()
	cfg.GetCertificate = w.GetCertificate
	return cfg, nil
}
