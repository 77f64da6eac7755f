package metrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// slowReader answers every List with nothing after a while, and counts them.
type slowReader struct {
	client.Reader
	lists atomic.Int32
}

func (r *slowReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	r.lists.Add(1)
	time.Sleep(50 * time.Millisecond)
	return nil
}

func elected() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// Scrapes sent together cost one walk of the cache, and with ReuseFor so do
// the scrapes that come shortly after it; without it, each later scrape
// walks again.
func TestConcurrentScrapesShareOneWalk(t *testing.T) {
	r := &slowReader{}
	o := NewObjects(r, elected()).ReuseFor(time.Hour)
	reg := prometheus.NewRegistry()
	reg.MustRegister(o)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if n, err := testutil.GatherAndCount(reg); err != nil || n == 0 {
				t.Errorf("a scrape got %d series, %v", n, err)
			}
		})
	}
	wg.Wait()
	if w := o.Walks(); w != 1 {
		t.Errorf("16 scrapes at once walked the cache %d times, want 1", w)
	}
	if _, err := testutil.GatherAndCount(reg); err != nil || o.Walks() != 1 {
		t.Errorf("a scrape within the reuse period walked again: %d walks, %v", o.Walks(), err)
	}

	fresh := NewObjects(r, elected())
	for range 3 {
		testutil.CollectAndCount(fresh)
	}
	if w := fresh.Walks(); w != 3 {
		t.Errorf("3 scrapes one after the other without ReuseFor walked %d times, want 3: each sees the cache as it is", w)
	}
}

// Beyond n requests in flight, the others are refused at once.
func TestScrapesBeyondTheBoundAreRefused(t *testing.T) {
	release := make(chan struct{})
	var inside atomic.Int32
	h := bounded(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		inside.Add(1)
		<-release
	}), 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/metrics", nil)) })
	}
	for inside.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("a third scrape with two in flight got %d, want 503", rec.Code)
	}
	close(release)
	wg.Wait()
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("once they ended, a scrape got %d, want 200", rec.Code)
	}
}

// The degraded gauge's reason label takes every reason an agent gives
// Degraded=True, and Other for anything else a node state says: a
// compromised node cannot grow the series.
func TestDegradedReasonLabelIsBounded(t *testing.T) {
	for in, want := range map[string]string{
		mptcpv1alpha1.ReasonInterfaceMissing: mptcpv1alpha1.ReasonInterfaceMissing,
		mptcpv1alpha1.ReasonInvalidSpec:      mptcpv1alpha1.ReasonInvalidSpec,
		mptcpv1alpha1.ReasonApplyFailed:      mptcpv1alpha1.ReasonApplyFailed,
		mptcpv1alpha1.ReasonMarkClash:        mptcpv1alpha1.ReasonMarkClash,
		mptcpv1alpha1.ReasonCapsNotEnforced:  mptcpv1alpha1.ReasonCapsNotEnforced,
		"Anything":                           "Other",
		"":                                   "Other",
	} {
		if got := degradedReason(in); got != want {
			t.Errorf("reason %q is labelled %q, want %q", in, got, want)
		}
	}
}
