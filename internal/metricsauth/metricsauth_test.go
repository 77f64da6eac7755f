package metricsauth

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/rest"
)

// reviewer is an API server that answers TokenReviews and
// SubjectAccessReviews: the tokens it knows belong to the reader, who may get
// /metrics. It counts the TokenReviews it was asked for.
type reviewer struct {
	srv     *httptest.Server
	readers map[string]bool

	mu      sync.Mutex
	reviews map[string]int // by token
}

const readerName = "system:serviceaccount:monitoring:prometheus"

func newReviewer(t *testing.T, readerTokens ...string) *reviewer {
	r := &reviewer{readers: map[string]bool{}, reviews: map[string]int{}}
	for _, tok := range readerTokens {
		r.readers[tok] = true
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /apis/authentication.k8s.io/v1/tokenreviews", func(w http.ResponseWriter, req *http.Request) {
		var tr authenticationv1.TokenReview
		if err := json.NewDecoder(req.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.reviews[tr.Spec.Token]++
		r.mu.Unlock()
		if r.readers[tr.Spec.Token] {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: readerName}}
		}
		tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&tr)
	})
	mux.HandleFunc("POST /apis/authorization.k8s.io/v1/subjectaccessreviews", func(w http.ResponseWriter, req *http.Request) {
		var sar authorizationv1.SubjectAccessReview
		if err := json.NewDecoder(req.Body).Decode(&sar); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		a := sar.Spec.NonResourceAttributes
		sar.Status.Allowed = sar.Spec.User == readerName && a != nil && a.Path == MetricsPath && a.Verb == "get"
		sar.APIVersion, sar.Kind = "authorization.k8s.io/v1", "SubjectAccessReview"
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&sar)
	})
	r.srv = httptest.NewServer(mux)
	t.Cleanup(r.srv.Close)
	return r
}

// forgedReviews counts the reviews of tokens the reviewer does not know.
func (r *reviewer) forgedReviews() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for tok, c := range r.reviews {
		if !r.readers[tok] {
			n += c
		}
	}
	return n
}

// guarded serves "metrics" behind a Guard that asks r; scrape returns the
// status a GET /metrics from the address from (host:port) with token gets.
func guarded(t *testing.T, r *reviewer) (g *Guard, scrape func(from, token string) int) {
	t.Helper()
	// JSON, which the reviewer decodes; no client-side rate limit: what
	// limits the reviews is the Guard.
	g, err := NewGuard(&rest.Config{Host: r.srv.URL, QPS: -1,
		ContentConfig: rest.ContentConfig{ContentType: "application/json", AcceptContentTypes: "application/json"}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h := g.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("metrics\n")) }))
	return g, func(from, token string) int {
		req := httptest.NewRequest(http.MethodGet, MetricsPath, nil)
		req.RemoteAddr = from
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code == http.StatusOK && !strings.Contains(rec.Body.String(), "metrics") {
			t.Fatalf("200 without the metrics: %q", rec.Body.String())
		}
		return rec.Code
	}
}

// Addresses of the documentation ranges: the requests are made in memory,
// nothing is sent to them.
const (
	readerAddr   = "192.0.2.10:41000"
	attackerAddr = "198.51.100.66:50000"
)

// Random tokens are what an attacker without credentials can send, each a
// review the agent asks the API server for. They must not use up the
// reviews a real scraper needs, whether it comes from another address with a
// token the agent has not seen yet or from the same address with a token the
// agent has already reviewed, and they must reach the API server only at a
// bounded rate.
func TestForgedTokensFromOneSourceDoNotLockOutAReader(t *testing.T) {
	r := newReviewer(t, "reader-1", "reader-2")
	_, scrape := guarded(t, r)
	start := time.Now()

	if got := scrape(readerAddr, "reader-1"); got != http.StatusOK {
		t.Fatalf("the reader before any flood: %d", got)
	}
	limited := 0
	for i := range 200 {
		switch got := scrape(attackerAddr, fmt.Sprintf("forged-%d", i)); got {
		case http.StatusTooManyRequests:
			limited++
		case http.StatusUnauthorized:
		default:
			t.Fatalf("forged token %d: %d", i, got)
		}
	}
	if limited == 0 {
		t.Fatal("200 forged tokens in a row were all reviewed")
	}
	if got := scrape(readerAddr, "reader-1"); got != http.StatusOK {
		t.Errorf("the reader with its reviewed token after the flood: %d", got)
	}
	// Another scraper, and a token the agent has never seen.
	if got := scrape("192.0.2.11:41000", "reader-2"); got != http.StatusOK {
		t.Errorf("a reader at another address, with a new token, after the flood: %d", got)
	}
	if got := scrape(attackerAddr, "reader-1"); got != http.StatusOK {
		t.Errorf("the flooding address itself with a reviewed token: %d", got)
	}
	if n, most := r.forgedReviews(), reviewBurst+int(time.Since(start).Seconds()*reviewsPerSec)+1; n > most {
		t.Errorf("the API server reviewed %d forged tokens, more than the agent's budget of %d", n, most)
	}
}

// Many addresses flooding together (a tenant's pods) can use up the reviews
// the agent allows itself for addresses it does not know; a scraper that
// the API server has already authorized at its address keeps being served
// when its token is replaced (projected tokens are, every hour or so), and
// the forged tokens still reach the API server at a bounded rate.
func TestAReadersNewTokenIsReviewedWhileManySourcesFlood(t *testing.T) {
	r := newReviewer(t, "reader-1", "reader-2")
	_, scrape := guarded(t, r)
	start := time.Now()
	if got := scrape(readerAddr, "reader-1"); got != http.StatusOK {
		t.Fatalf("the reader before any flood: %d", got)
	}
	for s := range 64 {
		for i := range 8 {
			scrape(fmt.Sprintf("198.51.100.%d:50000", s+1), fmt.Sprintf("forged-%d-%d", s, i))
		}
	}
	if got := scrape(readerAddr, "reader-2"); got != http.StatusOK {
		t.Errorf("the reader's next token during a flood from 64 addresses: %d", got)
	}
	if n, most := r.forgedReviews(), reviewBurst+int(time.Since(start).Seconds()*reviewsPerSec)+1; n > most {
		t.Errorf("the API server reviewed %d forged tokens, more than the agent's budget of %d", n, most)
	}
}

// The budgets per address and the readers' addresses are kept for a bounded
// number of addresses, however many a flood comes from (IPv6 gives a pod
// plenty), and only an authorized token makes an address a reader's.
func TestTheTablesPerAddressAreBounded(t *testing.T) {
	r := newReviewer(t, "reader-1")
	g, scrape := guarded(t, r)
	for i := range 3 * maxSources {
		scrape(fmt.Sprintf("[2001:db8::%x]:50000", i+1), "forged")
	}
	for i := range 2 * maxReaders {
		if got := scrape(fmt.Sprintf("[2001:db8:1::%x]:50000", i+1), "reader-1"); got != http.StatusOK {
			t.Fatalf("the reader's token from address %d: %d", i, got)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if n := g.sources.lru.Len(); n > maxSources || len(g.sources.byAddr) != n {
		t.Errorf("%d budgets kept (%d in the index), at most %d", n, len(g.sources.byAddr), maxSources)
	}
	if n := len(g.readers); n != maxReaders {
		t.Errorf("%d readers' addresses kept, want the last %d", n, maxReaders)
	}
	for a := range g.readers {
		if !strings.HasPrefix(a.String(), "2001:db8:1::") {
			t.Errorf("%s, which only sent a forged token, counts as a reader's", a)
		}
	}
}
