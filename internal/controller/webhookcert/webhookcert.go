// Package webhookcert keeps the webhook's serving certificate in one Secret
// that every controller replica reads through the API, and serves it from
// memory: a replica serves as soon as it starts, with no mounted volume to
// wait for (the kubelet refreshes a Secret's volume only on its next sync,
// up to a minute later). The certificate is self-signed, valid for a year
// and renewed when a third of that is left. The webhook configuration's
// caBundle holds the Secret's certificate and nothing else, but for the one
// it replaced during KeepPrevious after the renewal, so that replicas still
// serving the old one are trusted until they have read the new one: any
// other certificate found there is removed at the next Sync.
//
// Where cert-manager issues the certificate instead (the chart's
// webhook.certManager), Manager only reads the Secret (Issue false) and
// never reads or writes the configuration: cert-manager's CA injector sets
// the caBundle to the Certificate's CA.
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
	// KeepPrevious is how long after a renewal the caBundle still holds
	// the certificate it replaced: six times the 10 minutes after which
	// every replica has read the Secret again (Server sets Every).
	KeepPrevious = time.Hour
	// backdate is how far before its issue a certificate's validity
	// starts (clocks of the API server and the controller may differ); a
	// certificate's issue time is its NotBefore plus backdate.
	backdate = time.Hour
	// conflictRetries is how many times the caBundle is written again at
	// once when another replica wrote the configuration in between.
	conflictRetries = 3
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
		if err := m.keepCABundle(ctx); err != nil {
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

// keepCABundle sets the caBundle of every webhook of the configuration to
// the Secret's certificate, and the one it replaced while a renewal is
// recent (KeepPrevious): whatever else the bundle held is dropped. The
// configuration is read before the Secret, and written with the version
// read: a renewal by another replica that this bundle misses was written
// after both reads, and that replica's own write of the bundle comes after
// this one or conflicts with it, so a replica that read the Secret before
// another renewed it cannot leave the new certificate out. A conflict is
// tried again at once: waiting for the next Sync would leave a renewal
// untrusted meanwhile.
func (m *Manager) keepCABundle(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		var cfg admissionregistrationv1.MutatingWebhookConfiguration
		if err := m.Client.Get(ctx, client.ObjectKey{Name: m.Webhook}, &cfg); err != nil {
			return fmt.Errorf("reading MutatingWebhookConfiguration %s (the chart creates it): %w", m.Webhook, err)
		}
		var sec corev1.Secret
		if err := m.Client.Get(ctx, m.Secret, &sec); err != nil {
			return fmt.Errorf("reading Secret %s: %w", m.Secret, err)
		}
		bundle := m.bundle(&sec)
		if len(bundle) == 0 {
			return fmt.Errorf("webhook certificate Secret %s holds no valid certificate for the caBundle", m.Secret)
		}
		changed := false
		for i := range cfg.Webhooks {
			if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, bundle) {
				cfg.Webhooks[i].ClientConfig.CABundle = bundle
				changed = true
			}
		}
		if !changed {
			return nil
		}
		err := m.Client.Update(ctx, &cfg)
		if apierrors.IsConflict(err) && attempt < conflictRetries {
			continue
		}
		if err == nil {
			m.Log.Info("set the webhook's caBundle", "configuration", m.Webhook, "certificates", bytes.Count(bundle, []byte("-----BEGIN")))
		}
		return err
	}
}

// bundle is the PEM of the Secret's valid certificates, then those of the
// certificate it replaced while the current one was issued less than
// KeepPrevious ago; each once.
func (m *Manager) bundle(sec *corev1.Secret) []byte {
	now := m.now()
	current := validCerts(sec.Data[corev1.TLSCertKey], now)
	certs := current
	if len(current) > 0 && now.Before(current[0].NotBefore.Add(backdate+KeepPrevious)) {
		certs = append(certs, validCerts(sec.Data[keyPrevious], now)...)
	}
	var out []byte
	seen := map[string]bool{}
	for _, c := range certs {
		if !seen[string(c.Raw)] {
			seen[string(c.Raw)] = true
			out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
		}
	}
	return out
}

// validCerts returns the certificates of p that are valid at now, in order.
func validCerts(p []byte, now time.Time) []*x509.Certificate {
	var certs []*x509.Certificate
	for rest := p; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			return certs
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err == nil && now.Before(c.NotAfter) {
			certs = append(certs, c)
		}
	}
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
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: names[0], Organization: []string{"mptcp-operator"}},
		DNSNames:              names,
		NotBefore:             now.Add(-backdate),
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
