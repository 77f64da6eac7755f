package observe

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mptcp-operator/mptcp-operator/internal/metricsauth"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// TestMetricsNeedAnAuthorizedTokenWhenAuthIsOn serves a real agent's metrics
// (its datapath loaded, a live MPTCP connection in its tables) as
// -metrics-auth does, with the agent's pod-bound token and the RBAC the chart
// gives it (config/agent, config/metrics-auth), against a real API server.
// Scrapers carry pod-bound tokens of their own service accounts: only one
// bound to mptcp-metrics-reader gets the metrics, and they spell no token.
func TestMetricsNeedAnAuthorizedTokenWhenAuthIsOn(t *testing.T) {
	src, _, _ := sourceWithAConnection(t)
	conns, err := src.dp.Connections()
	if err != nil || len(conns) != 1 {
		t.Fatalf("connections %+v, %v", conns, err)
	}
	env := testenv.Start(t, testenv.ServiceAccountTokens())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env.Namespace(t, "mptcp-system", nil)
	env.Namespace(t, "monitoring", nil)
	root := testenv.RepoRoot()
	for _, f := range []string{"config/agent/service_account.yaml", "config/agent/role.yaml", "config/agent/role_binding.yaml",
		"config/metrics-auth/rbac.yaml"} {
		env.ApplyFile(t, filepath.Join(root, f))
	}
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}); err != nil {
		t.Fatal(err)
	}
	// podToken creates a service account (unless it exists) and a pod of
	// it on n1, and returns a token bound to that pod.
	podToken := func(ns, account string) string {
		t.Helper()
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: account}}
		if err := env.Client.Create(ctx, sa); err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatal(err)
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: account + "-0"},
			Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: account,
				Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/" + account}}},
		}
		if err := env.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		return env.PodToken(t, pod)
	}
	agentToken := podToken("mptcp-system", "mptcp-agent")
	reader := podToken("monitoring", "prometheus")
	intruder := podToken("monitoring", "curious")
	// The admin binds Prometheus to the chart's reader role.
	if err := env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-reads-mptcp"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "mptcp-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "monitoring", Name: "prometheus"}},
	}); err != nil {
		t.Fatal(err)
	}

	serve := func(agentCreds string) string {
		t.Helper()
		guard, err := metricsauth.NewGuard(env.AsToken(agentCreds), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		tlsConfig, err := metricsauth.TLSConfig(ctx, "", "mptcp-agent", slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		addr, wait, err := ServeTLS(ctx, "127.0.0.1:0", guard.Handler(NewMetrics(src, slog.New(slog.DiscardHandler)).Handler()), tlsConfig, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(wait)
		return addr.String()
	}
	addr := serve(agentToken)
	// The certificate is self-signed: this scraper skips verification,
	// as the chart's ServiceMonitor does only when the admin says so.
	httpsClient := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a self-signed certificate, as scrapers see it
	}}
	get := func(method, base, path, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := httpsClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	base := "https://" + addr
	tokenHex := fmt.Sprintf("%08x", conns[0].Token)

	cases := map[string]struct {
		method, path, token string
		status              int // the answer's status
	}{
		"no token":                         {path: "/metrics", status: http.StatusUnauthorized},
		"a token the API server rejects":   {path: "/metrics", token: "not-a-token", status: http.StatusUnauthorized},
		"a service account without right":  {path: "/metrics", token: intruder, status: http.StatusForbidden},
		"the agent's own credentials":      {path: "/metrics", token: agentToken, status: http.StatusForbidden},
		"a reader's token":                 {path: "/metrics", token: reader, status: http.StatusOK},
		"a reader's token, twice (cached)": {path: "/metrics", token: reader, status: http.StatusOK},
		"another method":                   {method: http.MethodPost, path: "/metrics", token: reader, status: http.StatusMethodNotAllowed},
		"a path around /metrics":           {path: "/metrics/", status: http.StatusNotFound},
		"the liveness probe, no token":     {path: "/healthz", status: http.StatusOK},
		"the readiness probe, no token":    {path: "/readyz", status: http.StatusServiceUnavailable}, // no reconcile yet
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			status, body := get(method, base, tc.path, tc.token)
			if status != tc.status {
				t.Fatalf("%s %s: %d %q, want %d", method, tc.path, status, body, tc.status)
			}
			if status != http.StatusOK && strings.Contains(body, "mptcp_agent_") {
				t.Fatalf("a refusal carries metrics: %q", body)
			}
			if tc.path != "/metrics" || status != http.StatusOK {
				return
			}
			if !strings.Contains(body, `mptcp_agent_table_entries{table="connections"} 1`) {
				t.Fatalf("the reader did not get the agent's metrics:\n%s", body)
			}
			if strings.Contains(body, tokenHex) || strings.Contains(body, "token=") {
				t.Fatalf("the metrics spell the connection's token %s", tokenHex)
			}
		})
	}

	t.Run("no clear text", func(t *testing.T) {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics")
		if err == nil {
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if strings.Contains(string(body), "mptcp_agent_") {
				t.Fatal("metrics served over plain HTTP")
			}
		}
	})
	t.Run("the agent cannot ask the API server: refused, never served", func(t *testing.T) {
		// An agent whose credentials may not create reviews (here the
		// intruder's) cannot tell who the reader is.
		status, body := get(http.MethodGet, "https://"+serve(intruder), "/metrics", reader)
		if status != http.StatusServiceUnavailable || strings.Contains(body, "mptcp_agent_") {
			t.Fatalf("%d %q, want 503 and no metrics", status, body)
		}
	})
	t.Run("new tokens in a burst are rate-limited, not each reviewed", func(t *testing.T) {
		limited := 0
		for i := range 40 {
			status, _ := get(http.MethodGet, base, "/metrics", fmt.Sprintf("forged-%d", i))
			switch status {
			case http.StatusTooManyRequests:
				limited++
			case http.StatusUnauthorized:
			default:
				t.Fatalf("forged token %d: %d", i, status)
			}
		}
		if limited == 0 {
			t.Fatal("40 new tokens in a row were all reviewed")
		}
		// A reader whose answer is cached is still served meanwhile.
		if status, _ := get(http.MethodGet, base, "/metrics", reader); status != http.StatusOK {
			t.Fatalf("the reader during the burst: %d", status)
		}
	})
}
