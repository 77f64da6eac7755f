package agent

import (
	"errors"
	"log/slog"
	"maps"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/socketmptcp"
)

type fakeSocketProgram struct {
	listed map[uint64]bool
	closed bool
}

func (f *fakeSocketProgram) Set(cookies map[uint64]bool) error {
	f.listed = maps.Clone(cookies)
	return nil
}

func (f *fakeSocketProgram) Close() error {
	f.closed = true
	return nil
}

// The socket program's life, on a clock the test moves: a refusal that
// may pass is asked again after SocketRetry and not before, one that
// cannot is never asked again; once loaded, exactly the namespaces of the
// pods that want it are listed, a pod whose namespace cannot be read is
// reported and not a failure; observe-only lists nothing; with no pod left
// the program lists nothing at once and is closed after socketIdle.
func TestSocketProgramIsLoadedListedAndUnloadedAsPodsWantIt(t *testing.T) {
	clock := time.Unix(1_000_000, 0)
	loads := 0
	var loadErr error
	prog := &fakeSocketProgram{}
	a := &Agent{log: slog.New(slog.DiscardHandler)}
	s := &a.socketMPTCP
	s.now = func() time.Time { return clock }
	s.load = func() (socketProgram, error) {
		loads++
		if loadErr != nil {
			return nil, loadErr
		}
		return prog, nil
	}
	cookies := map[string]uint64{"apps.web": 11, "apps.api": 12}
	s.cookie = func(p PlanPod) (uint64, error) {
		if c, ok := cookies[p.Name]; ok {
			return c, nil
		}
		return 0, errors.New("its namespace is gone")
	}
	plan := func(observeOnly bool, kernel ...string) *Plan {
		p := &Plan{Settings: Settings{ObserveOnly: observeOnly}}
		p.Pods = append(p.Pods, PlanPod{Name: "apps.inject", Transparent: TransparencyInject})
		for _, name := range kernel {
			p.Pods = append(p.Pods, PlanPod{Name: name, Transparent: TransparencyKernel})
		}
		return p
	}
	sync := func(p *Plan, after time.Duration) SocketMPTCP {
		t.Helper()
		clock = clock.Add(after)
		if err := a.syncSocketMPTCP(p); err != nil {
			t.Fatal(err)
		}
		return a.SocketMPTCP()
	}

	loadErr = &socketmptcp.UnsupportedError{Err: unix.ENOMEM}
	r := sync(plan(false, "apps.web"), 0)
	if loads != 1 || r.Unsupported == "" || !r.Retrying || !r.Uncovered["apps.web"] || r.Wanted != 1 {
		t.Fatalf("a refusal that may pass: %d loads, report %+v", loads, r)
	}
	sync(plan(false, "apps.web"), SocketRetry/2)
	if loads != 1 {
		t.Errorf("asked again %d times within %v", loads-1, SocketRetry)
	}
	loadErr = nil
	r = sync(plan(false, "apps.web", "apps.api", "apps.gone"), SocketRetry)
	if loads != 2 || r.Unsupported != "" || r.Covered != 2 || r.Wanted != 3 || !r.Uncovered["apps.gone"] || len(r.Uncovered) != 1 {
		t.Fatalf("loaded: %d loads, report %+v", loads, r)
	}
	if want := map[uint64]bool{11: true, 12: true}; !maps.Equal(prog.listed, want) {
		t.Errorf("listed %v, want %v", prog.listed, want)
	}
	r = sync(plan(true, "apps.web"), time.Second)
	if !r.ObserveOnly || !r.Uncovered["apps.web"] || len(prog.listed) != 0 || prog.closed {
		t.Errorf("observe-only: report %+v, listed %v, closed %v; want nothing listed, still loaded", r, prog.listed, prog.closed)
	}
	sync(plan(false, "apps.web"), time.Second)
	sync(plan(false), time.Second)
	if len(prog.listed) != 0 || prog.closed {
		t.Errorf("no pod wants it: listed %v, closed %v; want nothing listed, still loaded", prog.listed, prog.closed)
	}
	sync(plan(false), socketIdle-2*time.Second)
	if prog.closed {
		t.Errorf("closed before %v without pods", socketIdle)
	}
	sync(plan(false), 2*time.Second)
	if !prog.closed {
		t.Errorf("still loaded %v after the last pod", socketIdle)
	}

	// A refusal that cannot pass is never asked again.
	loads, loadErr = 0, &socketmptcp.UnsupportedError{Err: unix.EPERM, Permanent: true}
	for range 3 {
		r = sync(plan(false, "apps.web"), time.Hour)
	}
	if loads != 1 || r.Retrying || r.Unsupported == "" {
		t.Errorf("a refusal that cannot pass: %d loads, report %+v", loads, r)
	}
}
