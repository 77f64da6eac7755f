package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// serviceAccountDir is where the kubelet mounts a pod's service-account
// token and the cluster's CA.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// await waits until the pod it runs in has condition -condition True, asking
// the API server as any in-cluster client does (KUBERNETES_SERVICE_HOST and
// _PORT, the pod's service-account token and CA); POD_NAME and POD_NAMESPACE
// come from the downward API. Run as an init container, it holds the pod's
// workload until then: a readiness gate alone does not (the kubelet starts
// containers at once; the gate only keeps the pod out of Ready). The
// service account needs get on pods.
func await(args []string) error {
	fs := flag.NewFlagSet("await", flag.ExitOnError)
	condition := fs.String("condition", "mptcp.io/ready", "pod condition type to wait for")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	_ = fs.Parse(args)
	name, ns := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if name == "" || ns == "" || host == "" || port == "" {
		return errors.New("await needs POD_NAME, POD_NAMESPACE (downward API), KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT")
	}
	ca, err := os.ReadFile(filepath.Join(serviceAccountDir, "ca.crt"))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return errors.New("no certificate in the service account's ca.crt")
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url := "https://" + net.JoinHostPort(host, port) + "/api/v1/namespaces/" + ns + "/pods/" + name
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	fmt.Fprintf(os.Stderr, "waiting for condition %s of pod %s/%s\n", *condition, ns, name)
	var last error
	for {
		ok, err := podCondition(ctx, hc, url, *condition)
		switch {
		case ok:
			fmt.Fprintf(os.Stderr, "condition %s is True\n", *condition)
			return nil
		case err != nil && (last == nil || err.Error() != last.Error()):
			fmt.Fprintln(os.Stderr, "asking the API server:", err)
		}
		last = err
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("condition %s of pod %s/%s not True after %s: %w", *condition, ns, name, *timeout, last)
			}
			return fmt.Errorf("condition %s of pod %s/%s not True after %s", *condition, ns, name, *timeout)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// podCondition says whether the pod at url has condition cond True. The
// token is read at every call: the kubelet rotates it.
func podCondition(ctx context.Context, hc *http.Client, url, cond string) (bool, error) {
	token, err := os.ReadFile(filepath.Join(serviceAccountDir, "token"))
	if err != nil {
		return false, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	if err != nil {
		return false, err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	var pod struct {
		Status struct {
			Conditions []struct {
				Type   string `json:"type"`
				Status string `json:"status"`
			} `json:"conditions"`
		} `json:"status"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&pod); err != nil {
		return false, err
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == cond {
			return c.Status == "True", nil
		}
	}
	return false, nil
}
