package podwebhook

import (
	"net/http"
	"net/netip"
	"sync"
	"time"
)

const (
	// MaxInFlight is how many reviews a replica works on at once, their
	// bodies' reading included; more wait, the longest-waiting request of
	// the source with the fewest reviews in flight first. A review costs
	// little, so this only bounds what a flood costs.
	MaxInFlight = 32
	// PerSourceInFlight is how many of those one source address (an IPv6
	// /64) holds: whoever floods the port from one address leaves the
	// other half to the API server, which is never kept waiting behind
	// that address's queue.
	PerSourceInFlight = MaxInFlight / 2
	// PerSourceWaiting is how many more requests of one address wait for
	// a slot; beyond, the answer is 429 at once, before the body is read.
	// The API server is one address or a few, each sending as many reviews
	// at once as pods are being created in opted-in namespaces: reviews
	// take about a millisecond, so 80 at once is a burst it does not reach
	// while the webhook keeps up.
	PerSourceWaiting = 64
	// MaxReviewBytes bounds a review's body: the API server takes request
	// bodies of at most 3 MiB, so none of its reviews is larger.
	MaxReviewBytes = 4 << 20
	// bodyTimeout is how long a review's body may take to arrive once it
	// has its slot: the API server sends it at once, a slow sender must not
	// hold the slot.
	bodyTimeout = 2 * time.Second
	// maxWait is how long a request waits for a slot: no webhook's timeout
	// is longer (the API server's limit), so the API server has given up
	// by then.
	maxWait = 30 * time.Second
)

// limiter bounds the reviews worked on at once, per source address and in
// all, in front of the webhook's handler.
type limiter struct {
	next                  http.Handler
	perSource, perWaiting int

	mu      sync.Mutex
	free    int
	seq     uint64
	sources map[netip.Addr]*source
}

type source struct {
	inFlight int
	waiting  []*waiter
}

type waiter struct {
	seq   uint64
	ready chan struct{}
}

// limitSources puts the webhook's bounds in front of next.
func limitSources(next http.Handler) http.Handler {
	return newLimiter(next, MaxInFlight, PerSourceInFlight, PerSourceWaiting)
}

func newLimiter(next http.Handler, slots, perSource, perWaiting int) *limiter {
	return &limiter{next: next, perSource: perSource, perWaiting: perWaiting, free: slots, sources: map[netip.Addr]*source{}}
}

// sourceOf is the address a request comes from, an IPv6 one as its /64
// (one host may hold all of it).
func sourceOf(remote string) netip.Addr {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return netip.Addr{}
	}
	a := ap.Addr().Unmap()
	if a.Is6() {
		a = netip.PrefixFrom(a, 64).Masked().Addr()
	}
	return a
}

func (l *limiter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	src := sourceOf(r.RemoteAddr)
	ok, wait := l.acquire(src)
	if !ok {
		http.Error(w, "too many reviews from this address", http.StatusTooManyRequests)
		return
	}
	if wait != nil {
		timer := time.NewTimer(maxWait)
		select {
		case <-wait.ready:
			timer.Stop()
		case <-r.Context().Done():
			timer.Stop()
			l.abandon(src, wait)
			return
		case <-timer.C:
			l.abandon(src, wait)
			http.Error(w, "no review slot in time", http.StatusTooManyRequests)
			return
		}
	}
	defer l.release(src)
	// The body is read while the slot is held: bounded in size and time.
	r.Body = http.MaxBytesReader(w, r.Body, MaxReviewBytes)
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(bodyTimeout))
	l.next.ServeHTTP(w, r)
}

// acquire takes a slot for src (wait nil), or a place in src's queue, or
// says no.
func (l *limiter) acquire(src netip.Addr) (ok bool, wait *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sources[src]
	if s == nil {
		s = &source{}
		l.sources[src] = s
	}
	// A free slot while others wait means those wait on their own
	// source's bound: this request passes none of them.
	if l.free > 0 && s.inFlight < l.perSource && len(s.waiting) == 0 {
		l.free--
		s.inFlight++
		return true, nil
	}
	if len(s.waiting) >= l.perWaiting {
		l.forget(src, s)
		return false, nil
	}
	l.seq++
	wait = &waiter{seq: l.seq, ready: make(chan struct{})}
	s.waiting = append(s.waiting, wait)
	return true, wait
}

// abandon takes a waiter that gave up out of its queue, or gives its slot
// back where it was granted meanwhile.
func (l *limiter) abandon(src netip.Addr, wait *waiter) {
	select {
	case <-wait.ready:
		l.release(src)
		return
	default:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-wait.ready: // granted between the two looks
		l.releaseLocked(src)
		return
	default:
	}
	s := l.sources[src]
	for i, w := range s.waiting {
		if w == wait {
			s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
			break
		}
	}
	l.forget(src, s)
}

func (l *limiter) release(src netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(src)
}

func (l *limiter) releaseLocked(src netip.Addr) {
	s := l.sources[src]
	s.inFlight--
	l.free++
	l.forget(src, s)
	l.grant()
}

// grant gives free slots to waiting requests: each to the source with the
// fewest in flight (below its bound), its longest-waiting request; ties to
// the request that waited longest.
func (l *limiter) grant() {
	for l.free > 0 {
		var best *source
		for _, s := range l.sources {
			if len(s.waiting) == 0 || s.inFlight >= l.perSource {
				continue
			}
			if best == nil || s.inFlight < best.inFlight || (s.inFlight == best.inFlight && s.waiting[0].seq < best.waiting[0].seq) {
				best = s
			}
		}
		if best == nil {
			return
		}
		w := best.waiting[0]
		best.waiting = best.waiting[1:]
		best.inFlight++
		l.free--
		close(w.ready)
	}
}

// forget drops a source that has nothing in flight or waiting.
func (l *limiter) forget(src netip.Addr, s *source) {
	if s.inFlight == 0 && len(s.waiting) == 0 {
		delete(l.sources, src)
	}
}
