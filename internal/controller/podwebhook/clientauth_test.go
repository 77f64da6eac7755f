package podwebhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// testCA is a CA that issues client certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// client issues a client certificate for commonName and dnsNames.
func (ca *testCA) client(t *testing.T, commonName string, dnsNames ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: commonName},
		DNSNames: dnsNames, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// With a client CA, the webhook's port reviews only for a caller whose
// certificate that CA signed and, with allowed names, that carries one of
// them as its CommonName or a DNS name; any other caller (none, another
// CA's, a name not allowed) is refused by the TLS handshake, before a
// request is read: a forged review learns nothing. TLS 1.2 and 1.3 alike.
func TestWithAClientCAOnlyItsAllowedCertificatesAreReviewed(t *testing.T) {
	apiCA, otherCA := newTestCA(t, "webhook-client-ca"), newTestCA(t, "other-ca")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, apiCA.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	pool, err := LoadClientCAs(caFile)
	if err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadClientCAs(notPEM); err == nil {
		t.Error("a CA file without a PEM certificate is loaded")
	}

	var reviewed atomic.Int32
	handler := limitSources(&webhook.Admission{Handler: admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		reviewed.Add(1)
		return admission.Allowed("")
	})})
	const apiserverName, apiserverDNS = "kube-apiserver-webhook-client", "apiserver.example"
	named := startServer(t, Options{ClientCAs: pool, ClientNames: []string{apiserverName, apiserverDNS}}, handler)
	anyName := startServer(t, Options{ClientCAs: pool}, handler)

	// review posts a review to addr over TLS version, with cert unless nil,
	// and returns the uid answered.
	review := func(addr string, version uint16, cert *tls.Certificate) (types.UID, error) {
		//nolint:gosec // the server's certificate is the test's own; the client's is what is tested
		conf := &tls.Config{InsecureSkipVerify: true, MinVersion: version, MaxVersion: version}
		if cert != nil {
			// Sent whatever CAs the server names as acceptable (a forger
			// would): crypto/tls's Certificates would withhold another
			// CA's.
			conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: conf}}
		defer client.CloseIdleConnections()
		uid := types.UID(fmt.Sprintf("uid-%d", time.Now().UnixNano()))
		body, _ := json.Marshal(admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{UID: uid, Namespace: "apps", Operation: admissionv1.Create,
				Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
				Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
				Object:   runtime.RawExtension{Raw: []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`)}},
		})
		resp, err := client.Post("https://"+addr+Path, "application/json", bytes.NewReader(body))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return "", err
		}
		var got admissionv1.AdmissionReview
		if err := json.Unmarshal(b, &got); err != nil || got.Response == nil {
			return "", fmt.Errorf("%s: answered %q", resp.Status, b)
		}
		if got.Response.UID != uid {
			return "", fmt.Errorf("answered uid %q, want %q", got.Response.UID, uid)
		}
		return got.Response.UID, nil
	}

	byName, byDNS := apiCA.client(t, apiserverName), apiCA.client(t, "some-client", apiserverDNS)
	otherName := apiCA.client(t, "tenant-pod", "tenant.apps.svc")
	otherCAs := otherCA.client(t, apiserverName, apiserverDNS)
	for _, c := range []struct {
		name   string
		addr   string
		cert   *tls.Certificate
		answer bool
	}{
		{"no certificate", named, nil, false},
		{"another CA's certificate with an allowed name", named, &otherCAs, false},
		{"the CA's certificate with a name not allowed", named, &otherName, false},
		{"the CA's certificate with an allowed CommonName", named, &byName, true},
		{"the CA's certificate with an allowed DNS name", named, &byDNS, true},
		{"no certificate, any name allowed", anyName, nil, false},
		{"another CA's certificate, any name allowed", anyName, &otherCAs, false},
		{"the CA's certificate, any name allowed", anyName, &otherName, true},
	} {
		for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
			before := reviewed.Load()
			_, err := review(c.addr, version, c.cert)
			handled := reviewed.Load() - before
			switch {
			case c.answer && (err != nil || handled != 1):
				t.Errorf("%s, %s: %v (reviewed %d times); want the review answered", c.name, tls.VersionName(version), err, handled)
			case !c.answer && (!refusedAtTLS(err) || handled != 0):
				t.Errorf("%s, %s: %v (reviewed %d times); want the handshake refused", c.name, tls.VersionName(version), err, handled)
			}
		}
	}
}
