// Package webhookcert keeps the webhook's serving certificate in one Secret
// that every controller replica reads through the API, and serves it from
// memory: a replica serves as soon as it starts, with no mounted volume to
// wait for (the kubelet refreshes a Secret's volume only on its next sync,
// up to a minute later). The certificate is self-signed, valid for a year
// and renewed when a third of that is left; its predecessor stays in the
// webhook configuration's caBundle beside it, so that replicas still
// serving the old one are trusted until they read the new one.
//
// Where cert-manager issues the certificate instead (the chart's
// webhook.certManager), Manager only reads the Secret (Issue false): the
// caBundle is cert-manager's to inject.
package webhookcert

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"slices"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// Validity of an issued certificate.
	Validity = 365 * 24 * time.Hour
	// keyPrevious holds the previous certificate (PEM) beside tls.crt, for
	// the caBundle while replicas move to the new one.
	keyPrevious = "previous.crt"
)

// Manager keeps the certificate.
type Manager struct {
	// Client reads and writes the Secret and the webhook configuration
	// directly (not through a cache: the controller caches no Secrets).
	Client client.Client
	Secret types.NamespacedName
	// DNSNames are the webhook Service's names.
	DNSNames []string
	// Webhook is the MutatingWebhookConfiguration whose caBundle Issue
	// keeps.
	Webhook string
	// Issue: this Manager issues and renews the certificate; false: it
	// only serves what the Secret holds.
	Issue bool
	// Every is how often the Secret is read again.
	Every time.Duration
	Log   *slog.Logger
	// Now is the clock (tests move it).
	Now func() time.Time

	current atomic.Pointer[tls.Certificate]
}

// GetCertificate serves the certificate last read (tls.Config).
func (m *Manager) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := m.current.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("no webhook certificate yet")
}

// Ready says whether a certificate is being served (a readiness check).
func (m *Manager) Ready() error {
	if m.current.Load() == nil {
		return errors.New("no webhook certificate yet")
	}
	return nil
}

// Start keeps the certificate until ctx ends (a manager.Runnable: every
// replica runs it, not only the leader).
func (m *Manager) Start(ctx context.Context) error {
	for {
		if err := m.Sync(ctx); err != nil {
			m.Log.Error("webhook certificate", "err", err)
		}
		every := m.Every
		if m.current.Load() == nil {
			every = 2 * time.Second
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(every):
		}
	}
}

// NeedLeaderElection: every replica serves the webhook.
func (m *Manager) NeedLeaderElection() bool { return false }

// Sync reads the Secret, issues or renews the certificate where it is
// missing, unusable or has a third of its validity left (when Issue),
// keeps the caBundle, and serves what the Secret holds.
func (m *Manager) Sync(ctx context.Context) error {
	var sec corev1.Secret
	if err := m.Client.Get(ctx, m.Secret, &sec); err != nil {
		return fmt.Errorf("reading Secret %s (the chart creates it): %w", m.Secret, err)
	}
	pair, leaf, err := parse(&sec)
	if m.Issue && (err != nil || m.renewDue(leaf)) {
		if err := m.issue(ctx, &sec); err != nil {
			return err
		}
		if pair, leaf, err = parse(&sec); err != nil {
			return err
		}
	}
	if err != nil {
		return fmt.Errorf("webhook certificate Secret %s: %w", m.Secret, err)
	}
	if m.Issue {
		if err := m.keepCABundle(ctx, &sec); err != nil {
			return err
		}
	}
	if old := m.current.Load(); old == nil || !bytes.Equal(old.Certificate[0], pair.Certificate[0]) {
		m.Log.Info("serving the webhook certificate", "expires", leaf.NotAfter, "secret", m.Secret.String())
	}
	m.current.Store(&pair)
	return nil
}

func (m *Manager) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

func (m *Manager) renewDue(leaf *x509.Certificate) bool {
	left := leaf.NotAfter.Sub(m.now())
	return left < leaf.NotAfter.Sub(leaf.NotBefore)/3
}

func parse(sec *corev1.Secret) (tls.Certificate, *x509.Certificate, error) {
	pair, err := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return pair, nil, fmt.Errorf("no usable certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	return pair, leaf, err
}

// issue writes a new certificate into sec, keeping the one it replaces as
// previous.crt. A conflict (another replica renewed first) is no error:
// sec is read again and holds theirs.
func (m *Manager) issue(ctx context.Context, sec *corev1.Secret) error {
	certPEM, keyPEM, err := selfSigned(m.DNSNames, m.now())
	if err != nil {
		return err
	}
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	if old := sec.Data[corev1.TLSCertKey]; len(old) > 0 {
		sec.Data[keyPrevious] = old
	}
	sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey] = certPEM, keyPEM
	err = m.Client.Update(ctx, sec)
	if apierrors.IsConflict(err) {
		return m.Client.Get(ctx, m.Secret, sec)
	}
	if err == nil {
		m.Log.Info("issued a webhook certificate", "secret", m.Secret.String(), "dnsNames", m.DNSNames)
	}
	return err
}

// keepCABundle makes every webhook of the configuration trust the Secret's
// certificate and the one it replaced, and keeps the still valid ones the
// bundle holds already: a replica that read the Secret before another
// renewed it cannot drop the new certificate. At most maxBundle, newest
// first.
func (m *Manager) keepCABundle(ctx context.Context, sec *corev1.Secret) error {
	var cfg admissionregistrationv1.MutatingWebhookConfiguration
	if err := m.Client.Get(ctx, client.ObjectKey{Name: m.Webhook}, &cfg); err != nil {
		return fmt.Errorf("reading MutatingWebhookConfiguration %s (the chart creates it): %w", m.Webhook, err)
	}
	changed := false
	for i := range cfg.Webhooks {
		have := cfg.Webhooks[i].ClientConfig.CABundle
		bundle := m.bundle(sec.Data[corev1.TLSCertKey], sec.Data[keyPrevious], have)
		if !bytes.Equal(have, bundle) {
			cfg.Webhooks[i].ClientConfig.CABundle = bundle
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return m.Client.Update(ctx, &cfg)
}

// maxBundle bounds the certificates a caBundle keeps.
const maxBundle = 3

// bundle is the PEM of the valid certificates among pems, each once,
// newest first, at most maxBundle.
func (m *Manager) bundle(pems ...[]byte) []byte {
	var certs []*x509.Certificate
	seen := map[string]bool{}
	for _, p := range pems {
		for rest := p; ; {
			var block *pem.Block
			if block, rest = pem.Decode(rest); block == nil {
				break
			}
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil || !m.now().Before(c.NotAfter) || seen[string(c.Raw)] {
				continue
			}
			seen[string(c.Raw)] = true
			certs = append(certs, c)
		}
	}
	slices.SortStableFunc(certs, func(a, b *x509.Certificate) int { return b.NotAfter.Compare(a.NotAfter) })
	var out []byte
	for _, c := range certs[:min(len(certs), maxBundle)] {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// selfSigned returns a certificate for names, its own CA, and its key.
func selfSigned(names []string, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: names[0], Organization: []string{"mptcp-operator"}},
		DNSNames:     names,
		// An hour back: clocks of the API server and the controller may
		// differ.
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(Validity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}
