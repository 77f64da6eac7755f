package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/controller"
	controllermetrics "github.com/mptcp-operator/mptcp-operator/internal/controller/metrics"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// What the flood test sets up and sends. The fillers make the cache hold
// what a cluster's would, so that a scrape that walks it costs what it
// would there.
const (
	fillerPolicies = 500
	flooders       = 160 // half with the reader's token, half with none
	floodFor       = 6 * time.Second
	// The lease is renewed every retryPeriod, and given up after
	// renewDeadline without a renewal. A policy's status is written
	// within about 0.2 s of its change here (0.8 s at worst on a loaded
	// machine) with the scrapes bounded; unbounded, the replica lost its
	// lease and never wrote it.
	retryPeriod   = 500 * time.Millisecond
	renewDeadline = 4 * retryPeriod
	maxReconcile  = 2 * time.Second
	floodURLEnv   = "MPTCP_FLOOD_URL"
	floodTokenEnv = "MPTCP_FLOOD_TOKEN"
)

// TestAScrapeFloodLeavesTheLeaseAndReconcilesAlone starts the controller's
// manager as main does (leader election, its metrics served with
// -metrics-auth) against a real API server, and floods /metrics from
// another process with many scrapes at once, half with a token allowed to
// read them and half with none, while a policy changes: the elected
// replica renews its lease on time throughout, and writes the policy's
// status within maxReconcile of each change.
func TestAScrapeFloodLeavesTheLeaseAndReconcilesAlone(t *testing.T) {
	env := testenv.Start(t, testenv.ServiceAccountTokens())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := env.Client
	env.Namespace(t, "mptcp-system", nil)
	env.Namespace(t, "monitoring", nil)
	env.ApplyFile(t, filepath.Join(testenv.RepoRoot(), "config", "metrics-auth", "rbac.yaml"))
	token := saToken(t, env, "monitoring", "prometheus", true)
	stranger := saToken(t, env, "monitoring", "stranger", false)

	env.ApplyFile(t, filepath.Join(testenv.RepoRoot(), "examples", "paths.yaml"))
	env.ApplyFile(t, filepath.Join(testenv.RepoRoot(), "examples", "policy-spread.yaml"))
	if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{"mptcp.io/multipath": "true"}},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.1.1.0/24"}}}); err != nil {
		t.Fatal(err)
	}
	// Labels and annotations as tooling leaves them on objects: what a
	// copy of the object costs.
	tags := map[string]string{}
	for i := range 128 {
		tags[fmt.Sprintf("example.com/tag-%d", i)] = "x"
	}
	var created sync.WaitGroup
	for w := range 8 {
		created.Go(func() {
			for i := w; i < fillerPolicies; i += 8 {
				p := &mptcpv1alpha1.MPTCPPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("filler-%d", i), Labels: tags, Annotations: tags},
					Spec: mptcpv1alpha1.MPTCPPolicySpec{
						NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": fmt.Sprintf("t%d", i)}},
						Spread:            mptcpv1alpha1.Spread{Paths: []mptcpv1alpha1.WeightedPath{{Name: "fabric-a"}, {Name: "fabric-b"}}},
					}}
				if err := c.Create(ctx, p); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	created.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d policies made", fillerPolicies)

	addr := "127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
	w := io.Discard // controller logs only when asked: they drown test output
	if os.Getenv("MPTCP_TEST_LOG") != "" {
		w = os.Stderr
	}
	log.SetLogger(zap.New(zap.WriteTo(w), zap.UseDevMode(true)))
	mgr, err := newManager(env.Config, ctrl.Options{
		Scheme:                  env.Scheme,
		HealthProbeBindAddress:  "0",
		LeaderElection:          true,
		LeaderElectionNamespace: "mptcp-system",
		// Short periods, so that a few seconds of flood span many
		// renewals.
		LeaseDuration: ptr.To(2 * renewDeadline),
		RenewDeadline: ptr.To(renewDeadline),
		RetryPeriod:   ptr.To(retryPeriod),
		Controller:    config.Controller{SkipNameValidation: ptr.To(true)},
	}, controllermetrics.Serving{BindAddress: addr, Auth: true, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := controller.Setup(ctx, mgr); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	select {
	case <-mgr.Elected():
	case err := <-stopped:
		t.Fatalf("manager stopped before it was elected: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("not elected within 20 s")
	}

	// Who may read: the reader's token only.
	url := "https://" + addr + "/metrics"
	testutil.Eventually(t, 20*time.Second, 100*time.Millisecond, "the reader's scrape", func() error {
		code, body, err := scrapeOnce(http.DefaultClient, url, token)
		if err == nil && (code != http.StatusOK || !strings.Contains(body, "mptcp_controller_policies")) {
			err = fmt.Errorf("%d: %.200s", code, body)
		}
		return err
	})
	for who, tok := range map[string]string{"no token": "", "a token not allowed /metrics": stranger, "a forged token": "forged"} {
		if code, body, err := scrapeOnce(http.DefaultClient, url, tok); err != nil || (code != http.StatusUnauthorized && code != http.StatusForbidden) {
			t.Errorf("a scrape with %s: %d %v, want 401 or 403: %.200s", who, code, err, body)
		}
	}
	waitGeneration(t, c, 1, 30*time.Second)

	// The flood, from another process: a scraper's CPU is its own.
	flood := exec.Command(os.Args[0], "-test.run=^TestScrapeFlooder$", "-test.v")
	flood.Env = append(os.Environ(), floodURLEnv+"="+url, floodTokenEnv+"="+token)
	out := &strings.Builder{}
	flood.Stdout, flood.Stderr = out, out
	if err := flood.Start(); err != nil {
		t.Fatal(err)
	}
	floodDone := make(chan error, 1)
	go func() { floodDone <- flood.Wait() }()
	t.Cleanup(func() {
		_ = flood.Process.Kill()
		<-floodDone
	})

	var renewals []time.Time
	var renewMu sync.Mutex
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var last time.Time
		for sampleCtx.Err() == nil {
			var lease coordinationv1.Lease
			if err := c.Get(sampleCtx, types.NamespacedName{Namespace: "mptcp-system", Name: leaderElectionID}, &lease); err == nil &&
				lease.Spec.RenewTime != nil && !lease.Spec.RenewTime.Time.Equal(last) {
				last = lease.Spec.RenewTime.Time
				renewMu.Lock()
				renewals = append(renewals, last)
				renewMu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	floodStart := time.Now()
	time.Sleep(time.Second) // the flood in full
	var reconciles []time.Duration
	// maxSubflows 5, 6, 5, ...: 4 before, so every update is a change.
	for gen := int64(2); time.Since(floodStart) < floodFor-2*time.Second; gen++ {
		updatePolicy(t, c, func(p *mptcpv1alpha1.MPTCPPolicy) { p.Spec.MaxSubflows = int32(5 + gen%2) })
		reconciles = append(reconciles, waitGeneration(t, c, gen, 20*time.Second))
		t.Logf("policy generation %d: status written %s after the change", gen, reconciles[len(reconciles)-1].Round(time.Millisecond))
	}
	select {
	case err := <-floodDone:
		floodDone <- err
	case <-time.After(floodFor + 10*time.Second):
		t.Fatal("the flooder did not end")
	}
	floodEnd := time.Now()
	stopSampling()
	<-sampled
	answers := map[string]int{}
	for line := range strings.Lines(out.String()) {
		if rest, ok := strings.CutPrefix(line, "answers: "); ok {
			_ = json.Unmarshal([]byte(rest), &answers)
		}
	}
	t.Logf("the flood's answers: %v", answers)
	if answers["reader 200"] == 0 {
		t.Errorf("the reader's scrapes got no metrics during the flood:\n%s", out)
	}

	for _, d := range reconciles {
		if d > maxReconcile {
			t.Errorf("a policy change's status was written %s after it, during the flood; want within %s", d.Round(time.Millisecond), maxReconcile)
		}
	}
	renewMu.Lock()
	defer renewMu.Unlock()
	var worst time.Duration
	prev := floodStart
	for _, r := range append(renewals, floodEnd) {
		if r.Before(floodStart) {
			continue
		}
		worst = max(worst, r.Sub(prev))
		prev = r
	}
	t.Logf("%d lease renewals during %s of flood, the longest gap %s (renewed every %s)",
		len(renewals), floodEnd.Sub(floodStart).Round(time.Millisecond), worst.Round(time.Millisecond), retryPeriod)
	if worst >= renewDeadline {
		t.Errorf("the lease went %s without a renewal during the flood; the replica gives it up after %s", worst.Round(time.Millisecond), renewDeadline)
	}
	select {
	case err := <-stopped:
		t.Fatalf("the manager stopped during the flood (its lease lost?): %v", err)
	default:
	}
}

// TestScrapeFlooder is the flood of TestAScrapeFloodLeavesTheLeaseAndReconcilesAlone,
// run in a process of its own: it scrapes $MPTCP_FLOOD_URL from many
// connections at once for floodFor, half with $MPTCP_FLOOD_TOKEN and half
// with none, and prints how many answers of each status each half got.
func TestScrapeFlooder(t *testing.T) {
	url, token := os.Getenv(floodURLEnv), os.Getenv(floodTokenEnv)
	if url == "" {
		t.Skip("the flood of TestAScrapeFloodLeavesTheLeaseAndReconcilesAlone, which runs it in a process of its own")
	}
	deadline := time.Now().Add(floodFor)
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for i := range flooders {
		tok := ""
		if i%2 == 0 {
			tok = token
		}
		wg.Go(func() {
			// Each its own keep-alive connection, as scrapers that
			// want to cost the server requests, not handshakes.
			hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: 1}}
			for time.Now().Before(deadline) {
				code, _, err := scrapeOnce(hc, url, tok)
				key := "error"
				if err == nil {
					key = strconv.Itoa(code)
				}
				who := "reader"
				if tok == "" {
					who = "anonymous"
				}
				mu.Lock()
				counts[who+" "+key]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b, _ := json.Marshal(counts)
	fmt.Printf("answers: %s\n", b)
}

// scrapeOnce GETs url with token (none when empty) and reads the answer.
func scrapeOnce(hc *http.Client, url, token string) (int, string, error) {
	if hc == http.DefaultClient {
		hc = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	}
	req, err := http.NewRequest(http.MethodGet, url, http.NoBody)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// saToken makes service account ns/name, with reader bound to the chart's
// mptcp-metrics-reader, and returns a token of it.
func saToken(t *testing.T, env *testenv.Env, ns, name string, reader bool) string {
	t.Helper()
	ctx := context.Background()
	if err := env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
		t.Fatal(err)
	}
	if !reader {
		return env.UnboundToken(t, ns, name)
	}
	if err := env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-" + name + "-reads-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "mptcp-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
	}); err != nil {
		t.Fatal(err)
	}
	return env.UnboundToken(t, ns, name)
}

func updatePolicy(t *testing.T, c client.Client, change func(*mptcpv1alpha1.MPTCPPolicy)) {
	t.Helper()
	for {
		var p mptcpv1alpha1.MPTCPPolicy
		if err := c.Get(context.Background(), types.NamespacedName{Name: "spread-fabrics"}, &p); err != nil {
			t.Fatal(err)
		}
		change(&p)
		err := c.Update(context.Background(), &p)
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "modified") {
			t.Fatal(err)
		}
	}
}

// waitGeneration waits until the policy's status is of generation gen, and
// returns how long that took.
func waitGeneration(t *testing.T, c client.Client, gen int64, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		var p mptcpv1alpha1.MPTCPPolicy
		if err := c.Get(context.Background(), types.NamespacedName{Name: "spread-fabrics"}, &p); err != nil {
			t.Fatal(err)
		}
		if p.Generation == gen && p.Status.ObservedGeneration == gen {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("policy at generation %d, its status at %d, after %s; want %d", p.Generation, p.Status.ObservedGeneration, within, gen)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
