package observe

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	privileged "github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// countingSource counts the collections scrapes cause: the datapath's
// collector asks for the path managers once per collection. Each ask takes
// a while, as entering many pods' namespaces does, so that scrapes sent
// together overlap.
type countingSource struct {
	source
	delay       time.Duration
	collections atomic.Int32
}

func (s *countingSource) PathManagers() []podnet.PathManagerState {
	s.collections.Add(1)
	time.Sleep(s.delay)
	return s.source.PathManagers()
}

// A scrape reads every table of the datapath and enters every selected pod's
// namespace. Whoever reaches the port can scrape as often and as many at once
// as it likes: scrapes sent together must cost one collection, and a scrape
// right after another none.
func TestConcurrentScrapesCostOneCollection(t *testing.T) {
	privileged.RequireRoot(t)
	dp, err := datapath.Load(datapath.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	src := &countingSource{source: source{dp: dp, paths: map[uint32]string{1: "fabric-a"}}, delay: 200 * time.Millisecond}
	srv := httptest.NewServer(NewMetrics(src, slog.New(slog.DiscardHandler)).Handler())
	defer srv.Close()

	scrape := func() (int, string, error) {
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	const scrapers = 16
	var wg sync.WaitGroup
	start := make(chan struct{})
	failures := make(chan string, scrapers)
	for range scrapers {
		wg.Go(func() {
			<-start
			status, body, err := scrape()
			switch {
			case err != nil:
				failures <- err.Error()
			case status != http.StatusOK:
				failures <- http.StatusText(status)
			case !strings.Contains(body, `mptcp_agent_path_down{path="fabric-a"} 0`):
				failures <- "a scrape without the datapath's metrics"
			}
		})
	}
	close(start)
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Error(f)
	}
	if n := src.collections.Load(); n != 1 {
		t.Fatalf("%d scrapes at once cost %d collections, want 1", scrapers, n)
	}
	if _, _, err := scrape(); err != nil {
		t.Fatal(err)
	}
	if n := src.collections.Load(); n != 1 {
		t.Fatalf("a scrape right after cost a collection of its own (%d in all)", n)
	}
}

// A result is reused for scrapeTTL after its collection ended, never longer:
// the metrics a scraper sees are at most that old.
func TestAScrapeAfterTheTTLCollectsAgain(t *testing.T) {
	collections := 0
	c := newOnceAPeriod(prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		collections++
		name := fmt.Sprintf("collection_%d", collections)
		return []*dto.MetricFamily{{Name: &name}}, nil
	}), scrapeTTL)
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	steps := []struct {
		after time.Duration // since the previous step
		want  string        // the family the scrape gets
	}{
		{0, "collection_1"},
		{scrapeTTL - time.Millisecond, "collection_1"},
		{time.Millisecond, "collection_2"},
		{scrapeTTL / 2, "collection_2"},
		{time.Hour, "collection_3"},
	}
	for i, s := range steps {
		now = now.Add(s.after)
		mfs, err := c.Gather()
		if err != nil || len(mfs) != 1 || mfs[0].GetName() != s.want {
			t.Fatalf("step %d: %v, %v; want %s", i, mfs, err, s.want)
		}
	}
}
