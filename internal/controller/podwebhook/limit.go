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
	// PerSourceInFlight is how many of those one source address holds:
	// whoever floods the port from one address leaves the other half to
	// the API server, which is never kept waiting behind that address's
	// queue.
	PerSourceInFlight = MaxInFlight / 2
	// MaxWaiting is how many more requests wait for a slot, all sources
	// together: each holds a connection and its headers, so this bounds
	// what waiting costs however many addresses send. When all places are
	// taken, a request from a source with fewer waiting than the source
	// with the most takes the place of that source's latest request, which
	// gets 429; any other request gets 429 at once, before its body is
	// read. So one address alone may fill the queue, yet never keeps the
	// API server out of it; many addresses leave it a fair share. The API
	// server is one address or a few, each sending as many reviews at once
	// as pods are being created in opted-in namespaces: reviews take about
	// a millisecond, so 80 at once is a burst it does not reach while the
	// webhook keeps up.
	MaxWaiting = 64
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
// all, and those waiting, in front of the webhook's handler. A source is
// kept only while it has a request in flight or waiting, so there are at
// most slots+maxWaiting of them: that bounds the table and the scans
// grant and acquire make under the lock.
type limiter struct {
	next                  http.Handler
	perSource, maxWaiting int

	mu      sync.Mutex
	free    int
	waiting int
	seq     uint64
	sources map[netip.Addr]*source
}

type source struct {
	addr     netip.Addr
	inFlight int
	waiting  []*waiter
}

type waiter struct {
	seq uint64
	// granted is set before ready is closed: true, a slot; false, the
	// request's place was taken (429).
	granted bool
	ready   chan struct{}
}

// limitSources puts the webhook's bounds in front of next.
func limitSources(next http.Handler) http.Handler {
	return newLimiter(next, MaxInFlight, PerSourceInFlight, MaxWaiting)
}

func newLimiter(next http.Handler, slots, perSource, maxWaiting int) *limiter {
	return &limiter{next: next, perSource: perSource, maxWaiting: maxWaiting, free: slots, sources: map[netip.Addr]*source{}}
}

// sourceOf is the address a request comes from, the whole address for
// IPv6 too: a prefix (a /64) can hold the API server's address with
// tenants' pods (EKS puts control-plane interfaces and pods' prefixes in
// one subnet, kubeadm's nodes may share a /64 with the API server), and
// a flood from that prefix would then queue the API server's reviews
// behind its own. A pod has an address of its own; one that holds many
// gets a fair share each, within the bounds in all.
func sourceOf(remote string) netip.Addr {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

func (l *limiter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	src := sourceOf(r.RemoteAddr)
	ok, wait := l.acquire(src)
	if !ok {
		http.Error(w, "too many reviews waiting", http.StatusTooManyRequests)
		return
	}
	if wait != nil {
		timer := time.NewTimer(maxWait)
		select {
		case <-wait.ready:
			timer.Stop()
			if !wait.granted {
				http.Error(w, "too many reviews waiting", http.StatusTooManyRequests)
				return
			}
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

// acquire takes a slot for src (wait nil), or a place in the queue, or
// says no.
func (l *limiter) acquire(src netip.Addr) (ok bool, wait *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sources[src]
	if s == nil {
		s = &source{addr: src}
	}
	// A free slot while others wait means those wait on their own
	// source's bound: this request passes none of them.
	if l.free > 0 && s.inFlight < l.perSource && len(s.waiting) == 0 {
		l.free--
		s.inFlight++
		l.sources[src] = s
		return true, nil
	}
	if l.waiting >= l.maxWaiting && !l.pushOut(len(s.waiting)) {
		return false, nil
	}
	l.seq++
	wait = &waiter{seq: l.seq, ready: make(chan struct{})}
	s.waiting = append(s.waiting, wait)
	l.waiting++
	l.sources[src] = s
	return true, wait
}

// pushOut refuses the latest request of the source with the most waiting,
// if it has more than has (ties: the latest request of them), and says
// whether it did.
func (l *limiter) pushOut(has int) bool {
	var most *source
	for _, s := range l.sources {
		n := len(s.waiting)
		if n <= has {
			continue
		}
		if most == nil || n > len(most.waiting) || (n == len(most.waiting) && s.waiting[n-1].seq > most.waiting[n-1].seq) {
			most = s
		}
	}
	if most == nil {
		return false
	}
	w := most.waiting[len(most.waiting)-1]
	most.waiting = most.waiting[:len(most.waiting)-1]
	l.waiting--
	close(w.ready)
	l.forget(most)
	return true
}

// abandon takes a waiter that gave up out of the queue, or gives its slot
// back where it was granted meanwhile.
func (l *limiter) abandon(src netip.Addr, wait *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-wait.ready: // granted, or pushed out, meanwhile
		if wait.granted {
			l.releaseLocked(src)
		}
		return
	default:
	}
	s := l.sources[src]
	for i, w := range s.waiting {
		if w == wait {
			s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
			l.waiting--
			break
		}
	}
	l.forget(s)
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
	l.forget(s)
	l.grant()
}

// grant gives free slots to waiting requests: each to the source with the
// fewest in flight (below its bound), its longest-waiting request; ties to
// the request that waited longest.
func (l *limiter) grant() {
	for l.free > 0 && l.waiting > 0 {
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
		l.waiting--
		w.granted = true
		close(w.ready)
	}
}

// forget drops a source that has nothing in flight or waiting.
func (l *limiter) forget(s *source) {
	if s.inFlight == 0 && len(s.waiting) == 0 {
		delete(l.sources, s.addr)
	}
}
