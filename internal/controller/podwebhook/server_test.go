package podwebhook

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

func testCertificate(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// startServer starts the webhook server as Server builds it for opts (on
// a free port, serving testCertificate) with handler at Path, until the
// test ends; it returns the server's address once it serves.
func startServer(t *testing.T, opts Options, handler http.Handler) string {
	t.Helper()
	opts.Port = testutil.FreePort(t)
	hook, _ := Server(opts, slog.New(slog.DiscardHandler))
	srv := hook.(*server)
	cert := testCertificate(t)
	srv.tlsOpts = append(srv.tlsOpts, func(c *tls.Config) {
		c.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil }
	})
	srv.Register(Path, handler)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	started := srv.StartedChecker()
	for deadline := time.Now().Add(10 * time.Second); started(nil) != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server did not start: %v", started(nil))
		}
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(opts.Port))
}

// The webhook's server, as Server builds it, refuses headers larger than
// maxHeaderBytes (431) and closes a connection that has not sent its
// headers within headerTimeout; the API server's requests, small and sent
// at once, are served. controller-runtime's own server takes 1 MiB of
// headers over 32 s.
func TestTheServerBoundsHeadersInSizeAndTime(t *testing.T) {
	addr := startServer(t, Options{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "reviewed")
	}))
	//nolint:gosec // the test's own certificate
	tlsConf := &tls.Config{InsecureSkipVerify: true}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConf}}
	post := func(header string) (int, error) {
		req, _ := http.NewRequest(http.MethodPost, "https://"+addr+Path, strings.NewReader("{}"))
		if header != "" {
			req.Header.Set("X-Filler", header)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	if code, err := post(strings.Repeat("a", 4<<10)); err != nil || code != http.StatusOK {
		t.Errorf("a review with 4 KiB of headers: %d, %v; want 200", code, err)
	}
	if code, err := post(strings.Repeat("a", 2*maxHeaderBytes)); err != nil || code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a review with %d KiB of headers: %d, %v; want 431", 2*maxHeaderBytes>>10, code, err)
	}

	// Headers begun, never finished: the server hangs up after headerTimeout.
	conn, err := tls.Dial("tcp", addr, tlsConf)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	if _, err := io.WriteString(conn, "POST "+Path+" HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(headerTimeout + 5*time.Second))
	_, err = bufio.NewReader(conn).ReadString('\n')
	var ne net.Error
	if took := time.Since(start); err == nil || (errors.As(err, &ne) && ne.Timeout()) || took > headerTimeout+time.Second {
		t.Errorf("a connection that never finished its headers: %v after %v; want closed within %v", err, took, headerTimeout+time.Second)
	}
}
