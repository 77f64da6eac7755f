package podwebhook

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// clientFrom sends requests from the loopback address local (Linux
// answers on all of 127.0.0.0/8), one connection per request in flight.
func clientFrom(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 1000}}
}

// A flood of reviews from one address, each taking the time a slow review
// takes, does not delay reviews from another address (the API server's)
// past a timeout well below the time the flood's queue takes to drain: the
// flooding address holds half of the slots, its excess is refused with 429
// before its body is read, and a slot that frees goes to the address with
// fewer reviews in flight.
func TestAFloodFromOneSourceDoesNotDelayAnothersReviews(t *testing.T) {
	const (
		work    = 100 * time.Millisecond
		flood   = 400 // requests at once: drained 32 at a time, 1.25 s of queue
		timeout = time.Second
	)
	var attackerNow, attackerMost atomic.Int64
	srv := httptest.NewServer(limitSources(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.RemoteAddr, "127.0.0.2:") {
			n := attackerNow.Add(1)
			defer attackerNow.Add(-1)
			for m := attackerMost.Load(); n > m && !attackerMost.CompareAndSwap(m, n); m = attackerMost.Load() {
			}
		}
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(work)
		_, _ = io.WriteString(w, "reviewed")
	})))
	t.Cleanup(srv.Close)

	ctx, stop := context.WithCancel(context.Background())
	var refused, served atomic.Int64
	var wg sync.WaitGroup
	attacker := clientFrom("127.0.0.2")
	for range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+Path, strings.NewReader("forged review"))
				resp, err := attacker.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusTooManyRequests:
					refused.Add(1)
					// An attacker would send again at once; a pause
					// keeps this shared machine's CPU for the server.
					time.Sleep(100 * time.Millisecond)
				case http.StatusOK:
					served.Add(1)
				}
			}
		}()
	}
	t.Cleanup(func() { stop(); wg.Wait() })
	time.Sleep(500 * time.Millisecond) // the flood fills the slots and the queue

	apiServer := clientFrom("127.0.0.1")
	var slowest time.Duration
	var reviews sync.WaitGroup
	var mu sync.Mutex
	for range 8 {
		reviews.Add(1)
		go func() {
			defer reviews.Done()
			for range 3 {
				start := time.Now()
				rctx, cancel := context.WithTimeout(context.Background(), 3*timeout)
				req, _ := http.NewRequestWithContext(rctx, http.MethodPost, srv.URL+Path, strings.NewReader("real review"))
				resp, err := apiServer.Do(req)
				took := time.Since(start)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				cancel()
				switch {
				case err != nil && errors.Is(err, context.DeadlineExceeded):
					t.Errorf("a real review got no answer in %v", 3*timeout)
				case err != nil:
					t.Errorf("a real review: %v", err)
				case resp.StatusCode != http.StatusOK:
					t.Errorf("a real review: %s", resp.Status)
				}
				mu.Lock()
				slowest = max(slowest, took)
				mu.Unlock()
			}
		}()
	}
	reviews.Wait()
	stop()
	wg.Wait()
	t.Logf("flood: %d served, %d refused, at most %d in flight; the slowest real review took %v", served.Load(), refused.Load(), attackerMost.Load(), slowest)
	if slowest > timeout {
		t.Errorf("a real review took %v during the flood, more than %v", slowest, timeout)
	}
	if refused.Load() == 0 {
		t.Errorf("none of the flood's %d requests at once was refused", flood)
	}
	if most := attackerMost.Load(); most > PerSourceInFlight {
		t.Errorf("the flooding address had %d reviews in flight at once, more than %d", most, PerSourceInFlight)
	}
}

// The bounds in numbers: one source holds perSource slots, and waits
// for more while places are left in the queue; another source takes the
// slots left, and a place in a full queue from the source with the most
// waiting, whose latest request is refused; a freed slot goes to the
// source with fewer in flight, whoever waited longer; a waiter that gives
// up leaves no trace.
func TestTheLimiterSharesSlotsBySource(t *testing.T) {
	l := newLimiter(nil, 4, 2, 3)
	a, b := sourceOf("10.0.0.1:1000"), sourceOf("10.0.0.2:1000")
	take := func(src string, want string) *waiter {
		t.Helper()
		ok, w := l.acquire(sourceOf(src))
		got := map[bool]string{true: "slot", false: "refused"}[ok]
		if ok && w != nil {
			got = "queued"
		}
		if got != want {
			t.Fatalf("%s: %s, want %s", src, got, want)
		}
		return w
	}
	take("10.0.0.1:1", "slot")
	take("10.0.0.1:2", "slot")
	a1 := take("10.0.0.1:3", "queued") // its bound of 2 in flight, with slots free
	a2 := take("10.0.0.1:4", "queued")
	a3 := take("10.0.0.1:5", "queued")
	take("10.0.0.1:6", "refused") // the queue is full, of a's own
	take("10.0.0.2:1", "slot")
	take("10.0.0.2:2", "slot")
	b1 := take("10.0.0.2:3", "queued") // no slot left: a's latest makes room
	select {
	case <-a3.ready:
		if a3.granted {
			t.Fatal("the request pushed out of the queue was granted a slot")
		}
	default:
		t.Fatal("a full queue refused a source with fewer waiting instead of the one with the most")
	}
	b2 := take("10.0.0.2:4", "queued") // a has 2 waiting, b 1: a's latest again
	select {
	case <-a2.ready:
	default:
		t.Fatal("a full queue refused a source with fewer waiting instead of the one with the most")
	}
	take("10.0.0.2:5", "refused") // a 1 waiting, b 2: b has the most
	l.release(a)                  // a has 1 in flight, b 2: a's oldest waiter gets it
	select {
	case <-a1.ready:
		if !a1.granted {
			t.Fatal("a slot's waiter was told to go")
		}
	default:
		t.Fatal("a freed slot did not go to the waiting source with fewer in flight")
	}
	l.release(b) // b has 1, a 2: b's
	select {
	case <-b1.ready:
	default:
		t.Fatal("a freed slot did not go to the waiting source with fewer in flight")
	}
	// b's remaining waiter gives up; every slot given back leaves nothing.
	l.abandon(b, b2)
	for range 2 {
		l.release(a)
		l.release(b)
	}
	if l.free != 4 || l.waiting != 0 || len(l.sources) != 0 {
		t.Errorf("after every slot was given back: %d free, %d waiting, %d sources kept", l.free, l.waiting, len(l.sources))
	}
}

// IPv6 sources are whole addresses: a /64 may hold the API server's
// address with a tenant's pods.
func TestIPv6SourcesAreWholeAddresses(t *testing.T) {
	if sourceOf("[2001:db8::1]:1") == sourceOf("[2001:db8::2]:1") {
		t.Error("two addresses of one /64 are one source")
	}
	if sourceOf("[2001:db8::1]:1") != sourceOf("[2001:db8::1]:2") || sourceOf("[::ffff:10.0.0.1]:1") != sourceOf("10.0.0.1:2") {
		t.Error("one address is more than one source")
	}
	// A flood from a neighbour in the API server's /64 leaves it its own
	// share of the slots.
	l := newLimiter(nil, 4, 2, 64)
	for i := range 10 {
		l.acquire(sourceOf("[2001:db8::bad]:" + strconv.Itoa(i+1)))
	}
	if ok, w := l.acquire(sourceOf("[2001:db8::a]:443")); !ok || w != nil {
		t.Errorf("the API server's review next to a flood in its /64: granted %v, queued %v", ok, w != nil)
	}
}

// Many addresses each sending what one may leave at most MaxWaiting
// requests waiting in all and the sources kept bounded, each pushed-out
// or refused request answered at once; a source that has none waiting
// still gets a place in the full queue.
func TestWaitingIsBoundedAcrossSources(t *testing.T) {
	l := newLimiter(nil, MaxInFlight, PerSourceInFlight, MaxWaiting)
	var queued []*waiter
	refused := 0
	for i := range 1000 {
		src := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		for range 3 {
			ok, w := l.acquire(src)
			switch {
			case !ok:
				refused++
			case w != nil:
				queued = append(queued, w)
			}
		}
		l.mu.Lock()
		waiting, sources := l.waiting, len(l.sources)
		n := 0
		for _, s := range l.sources {
			n += len(s.waiting)
		}
		l.mu.Unlock()
		if waiting > MaxWaiting || n != waiting || sources > MaxInFlight+MaxWaiting {
			t.Fatalf("after %d sources: %d waiting (%d in the queues), %d sources kept; want at most %d and %d",
				i+1, waiting, n, sources, MaxWaiting, MaxInFlight+MaxWaiting)
		}
	}
	pushedOut := 0
	for _, w := range queued {
		select {
		case <-w.ready:
			if w.granted {
				t.Fatal("a waiter was granted a slot no one gave back")
			}
			pushedOut++
		default:
		}
	}
	if want := 3000 - MaxInFlight - MaxWaiting; refused+pushedOut != want {
		t.Errorf("%d refused and %d pushed out, want %d in all", refused, pushedOut, want)
	}
	if ok, w := l.acquire(netip.MustParseAddr("10.0.0.1")); !ok || w == nil {
		t.Errorf("a new source at a full queue: granted %v, queued %v; want queued", ok, w != nil)
	}
}

// A sender that holds a review's body back holds its slot for bodyTimeout
// at most: the review then fails, and the slot serves the next one.
func TestASlowBodyHoldsItsSlotForAtMostTheBodyTimeout(t *testing.T) {
	srv := httptest.NewServer(newLimiter(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, "reviewed")
	}), 1, 1, 1))
	t.Cleanup(srv.Close)
	slow, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	// Headers and a first byte of the 100 announced, then nothing.
	if _, err := io.WriteString(slow, "POST "+Path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // it has the only slot
	start := time.Now()
	c := clientFrom("127.0.0.1")
	c.Timeout = bodyTimeout + 3*time.Second
	resp, err := c.Post(srv.URL+Path, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if took := time.Since(start); resp.StatusCode != http.StatusOK || took > bodyTimeout+time.Second {
		t.Errorf("the review behind a slow body: %s after %v; want 200 within %v", resp.Status, took, bodyTimeout+time.Second)
	}
}
