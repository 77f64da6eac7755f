package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// Prometheus is a real Prometheus server (built from its Go module: make
// prometheus) running in a node's network namespace of a bed, scraping what
// the bed's jobs name and evaluating rule files, queried through its HTTP
// API from inside that namespace.
type Prometheus struct {
	proc   *testbed.Process
	addr   string
	client *http.Client
}

// PrometheusOptions are what a Prometheus scrapes and evaluates.
type PrometheusOptions struct {
	// Jobs are scrape jobs: job name to targets (host:port). A job is named
	// as the Prometheus Operator names a ServiceMonitor's: by the Service.
	Jobs map[string][]string
	// RuleFiles are Prometheus rule files (groups of alerts).
	RuleFiles []string
	// Interval is the scrape and evaluation interval.
	Interval time.Duration
	// Token, when set, is sent as a bearer token over HTTPS to the jobs
	// named in HTTPS (the chart's metricsAuth), whose certificates are not
	// verified: a bed's components make self-signed ones.
	Token string
	HTTPS []string
}

// StartPrometheus starts bin in node's network namespace with opts, and
// waits until its API answers.
func StartPrometheus(ctx context.Context, bed *testbed.Bed, node *testbed.Node, bin string, opts PrometheusOptions) (*Prometheus, error) {
	dir, err := os.MkdirTemp(bed.Dir, "prometheus-")
	if err != nil {
		return nil, err
	}
	interval := opts.Interval.String()
	config := map[string]any{
		"global":     map[string]any{"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
		"rule_files": opts.RuleFiles,
	}
	var jobs []map[string]any
	names := make([]string, 0, len(opts.Jobs))
	for name := range opts.Jobs {
		names = append(names, name)
	}
	sort.Strings(names)
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(opts.Token), 0o600); err != nil {
		return nil, err
	}
	for _, name := range names {
		// honor_labels: a pod's series carry its namespace and pod, as
		// the chart's ServiceMonitor keeps them.
		job := map[string]any{"job_name": name, "honor_labels": true,
			"static_configs": []map[string]any{{"targets": opts.Jobs[name]}}}
		if slices.Contains(opts.HTTPS, name) {
			job["scheme"] = "https"
			job["authorization"] = map[string]any{"type": "Bearer", "credentials_file": tokenFile}
			job["tls_config"] = map[string]any{"insecure_skip_verify": true}
		}
		jobs = append(jobs, job)
	}
	config["scrape_configs"] = jobs
	b, err := yaml.Marshal(config)
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		return nil, err
	}
	// The node's first NIC's address: the namespace's loopback would do
	// too, but an address of its own keeps it apart from anything that
	// listens on the node's loopback.
	addr := net.JoinHostPort(node.NICs[0].Addr.Addr().String(), "9490")
	proc, err := bed.Start(node.NetNS, bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	if err != nil {
		return nil, err
	}
	ns := "/var/run/netns/" + node.NetNS
	p := &Prometheus{proc: proc, addr: addr, client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			var c net.Conn
			err := netnsutil.Do(ns, func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, address)
				return err
			})
			return c, err
		},
	}}}
	for {
		if _, err := p.get(ctx, "/api/v1/status/buildinfo", nil); err == nil {
			return p, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("prometheus never answered (%w): %s", ctx.Err(), proc.Output())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops the server.
func (p *Prometheus) Stop() error { return p.proc.Stop(5 * time.Second) }

// get sends GET path?query and returns the API's data.
func (p *Prometheus) get(ctx context.Context, path string, query url.Values) (json.RawMessage, error) {
	u := "http://" + p.addr + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("GET %s: %d: %s", path, resp.StatusCode, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("GET %s %v: %s", path, query, r.Error)
	}
	return r.Data, nil
}

// Sample is one series of an instant query's result.
type Sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// Query evaluates expr now; an expression that is not a vector is an error.
func (p *Prometheus) Query(ctx context.Context, expr string) ([]Sample, error) {
	data, err := p.get(ctx, "/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		return nil, err
	}
	var r struct {
		ResultType string   `json:"resultType"`
		Result     []Sample `json:"result"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, err
	}
	if r.ResultType != "vector" {
		return nil, fmt.Errorf("%s: a %s, not a vector", expr, r.ResultType)
	}
	return r.Result, nil
}

// Selectors are the series selectors of expr ({__name__="x",a="b"}), as
// Prometheus parses it.
func (p *Prometheus) Selectors(ctx context.Context, expr string) ([]string, error) {
	data, err := p.get(ctx, "/api/v1/parse_query", url.Values{"query": {expr}})
	if err != nil {
		return nil, err
	}
	var ast any
	if err := json.Unmarshal(data, &ast); err != nil {
		return nil, err
	}
	var out []string
	var walk func(any)
	walk = func(n any) {
		switch n := n.(type) {
		case map[string]any:
			// A range's selector (matrixSelector) carries its
			// matchers as an instant one does.
			if n["type"] == "vectorSelector" || n["type"] == "matrixSelector" {
				var ms []string
				list, _ := n["matchers"].([]any)
				for _, m := range list {
					m, _ := m.(map[string]any)
					ms = append(ms, fmt.Sprintf("%s%s%q", m["name"], m["type"], m["value"]))
				}
				out = append(out, "{"+strings.Join(ms, ",")+"}")
				return
			}
			for _, v := range n {
				walk(v)
			}
		case []any:
			for _, v := range n {
				walk(v)
			}
		}
	}
	walk(ast)
	return out, nil
}

// Alert is an alert the rules evaluate as pending or firing.
type Alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// Alerts are the alerts pending or firing.
func (p *Prometheus) Alerts(ctx context.Context) ([]Alert, error) {
	data, err := p.get(ctx, "/api/v1/alerts", nil)
	if err != nil {
		return nil, err
	}
	var r struct {
		Alerts []Alert `json:"alerts"`
	}
	return r.Alerts, json.Unmarshal(data, &r)
}

// Rule is an alerting rule as Prometheus evaluated it last.
type Rule struct {
	Name      string `json:"name"`
	Query     string `json:"query"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
}

// Rules are the rules Prometheus loaded.
func (p *Prometheus) Rules(ctx context.Context) ([]Rule, error) {
	data, err := p.get(ctx, "/api/v1/rules", nil)
	if err != nil {
		return nil, err
	}
	var r struct {
		Groups []struct {
			Rules []Rule `json:"rules"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, err
	}
	var out []Rule
	for _, g := range r.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// Target is a scrape target and how its last scrape went.
type Target struct {
	Labels    map[string]string `json:"labels"`
	ScrapeURL string            `json:"scrapeUrl"`
	Health    string            `json:"health"`
	LastError string            `json:"lastError"`
}

// Targets are the active scrape targets.
func (p *Prometheus) Targets(ctx context.Context) ([]Target, error) {
	data, err := p.get(ctx, "/api/v1/targets", url.Values{"state": {"active"}})
	if err != nil {
		return nil, err
	}
	var r struct {
		ActiveTargets []Target `json:"activeTargets"`
	}
	return r.ActiveTargets, json.Unmarshal(data, &r)
}
