package podwebhook_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/mptcp-operator/mptcp-operator/internal/controller/podwebhook"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/webhookcert"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

var certSecret = types.NamespacedName{Namespace: "mptcp-system", Name: "webhook-cert"}

// plantedCA is a CA no Secret holds, valid for years: what a stolen
// controller token would put into the caBundle to be trusted as the webhook.
func plantedCA(t *testing.T, name string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(20 * 365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func setBundle(t *testing.T, c client.Client, bundle []byte) {
	t.Helper()
	var cfg admissionregistrationv1.MutatingWebhookConfiguration
	if err := c.Get(context.Background(), client.ObjectKey{Name: hookConfig}, &cfg); err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Webhooks {
		cfg.Webhooks[i].ClientConfig.CABundle = bundle
	}
	if err := c.Update(context.Background(), &cfg); err != nil {
		t.Fatal(err)
	}
}

// secretCert is the Secret's serving certificate.
func secretCert(t *testing.T, c client.Client) *x509.Certificate {
	t.Helper()
	var sec corev1.Secret
	if err := c.Get(context.Background(), certSecret, &sec); err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(sec.Data[corev1.TLSCertKey])
	if block == nil {
		t.Fatal("the Secret's tls.crt holds no certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func issuingManager(c client.Client) *webhookcert.Manager {
	_, certs := podwebhook.Server(podwebhook.Options{IssueCert: true, Configuration: hookConfig, CertSecret: certSecret,
		Service: types.NamespacedName{Namespace: "mptcp-system", Name: "mptcp-webhook"}}, slog.New(slog.DiscardHandler))
	certs.Client = c
	return certs
}

// CAs planted in the caBundle beside the controller's, longer-lived than
// it and more of them than the bundle ever held, are gone after one sync:
// the bundle is the Secret's certificate alone.
func TestAPlantedCAIsGoneAfterOneSync(t *testing.T) {
	env := testenv.Start(t)
	c, ctx := env.Client, context.Background()
	installWebhook(t, c, testutil.FreePort(t))
	certs := issuingManager(c)
	if err := certs.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	own := secretCert(t, c)
	var planted []byte
	for _, name := range []string{"planted-1", "planted-2", "planted-3"} {
		planted = append(planted, plantedCA(t, name)...)
	}
	for _, bundle := range [][]byte{
		append(append([]byte{}, planted...), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: own.Raw})...),
		planted, // the controller's own pushed out
	} {
		setBundle(t, c, bundle)
		if err := certs.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		got := certsInBundle(t, c)
		if len(got) != 1 || !got[0].Equal(own) {
			var names []string
			for _, g := range got {
				names = append(names, g.Subject.CommonName)
			}
			t.Errorf("after one sync the caBundle holds %q; want only the Secret's certificate", names)
		}
	}
}

// A replica that read the Secret just before another replica renewed it
// does not leave the new certificate out of the caBundle: its write of
// the bundle conflicts with the other's and is made again from the Secret
// read anew.
func TestAReplicaThatReadTheSecretBeforeARenewalKeepsTheNewCertificate(t *testing.T) {
	env := testenv.Start(t)
	c, ctx := env.Client, context.Background()
	installWebhook(t, c, testutil.FreePort(t))
	renewer := issuingManager(c)
	if err := renewer.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	first := secretCert(t, c)
	setBundle(t, c, plantedCA(t, "planted")) // so that the late replica has a bundle to write
	renewer.Now = func() time.Time { return time.Now().Add(250 * 24 * time.Hour) }

	direct, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	late := issuingManager(interceptor.NewClient(direct, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if _, ok := obj.(*admissionregistrationv1.MutatingWebhookConfiguration); ok {
				// The other replica renews between this replica's
				// reads and its write.
				once.Do(func() {
					if err := renewer.Sync(ctx); err != nil {
						t.Errorf("renewing: %v", err)
					}
				})
			}
			return c.Update(ctx, obj, opts...)
		},
	}))
	if err := late.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	renewed := secretCert(t, c)
	if renewed.Equal(first) {
		t.Fatal("the other replica did not renew")
	}
	got := certsInBundle(t, c)
	if len(got) != 2 || !got[0].Equal(renewed) || !got[1].Equal(first) {
		t.Errorf("the caBundle holds %d certificates; want the renewed one, then the one it replaced", len(got))
	}
}

// With cert-manager (IssueCert false) the controller serves the Secret's
// certificate and never reads or writes the webhook configuration (the
// chart grants it no right on it): the caBundle is the CA injector's,
// which sets it to the Certificate's CA alone.
func TestWithCertManagerTheControllerLeavesTheCABundleAlone(t *testing.T) {
	env := testenv.Start(t)
	c, ctx := env.Client, context.Background()
	installWebhook(t, c, testutil.FreePort(t))
	// The Secret as cert-manager writes it: issued once by a controller
	// that issues, then served by one that does not.
	if err := issuingManager(c).Sync(ctx); err != nil {
		t.Fatal(err)
	}
	issued := secretCert(t, c)
	planted := plantedCA(t, "planted")
	setBundle(t, c, planted)

	direct, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	var touched []string
	isConfig := func(obj client.Object) {
		if _, ok := obj.(*admissionregistrationv1.MutatingWebhookConfiguration); ok {
			touched = append(touched, obj.GetName())
		}
	}
	_, certs := podwebhook.Server(podwebhook.Options{IssueCert: false, Configuration: hookConfig, CertSecret: certSecret,
		Service: types.NamespacedName{Namespace: "mptcp-system", Name: "mptcp-webhook"}}, slog.New(slog.DiscardHandler))
	certs.Client = interceptor.NewClient(direct, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			isConfig(obj)
			return c.Get(ctx, key, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			isConfig(obj)
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			isConfig(obj)
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
	if err := certs.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	served, err := certs.GetCertificate(nil)
	if err != nil || !x509Equal(served.Certificate[0], issued) {
		t.Errorf("the served certificate is not the Secret's (%v)", err)
	}
	if len(touched) != 0 {
		t.Errorf("with cert-manager the controller read or wrote the webhook configuration %v", touched)
	}
	if got := certsInBundle(t, c); len(got) != 1 || string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: got[0].Raw})) != string(planted) {
		t.Errorf("the controller changed the caBundle with cert-manager")
	}
}

func x509Equal(der []byte, cert *x509.Certificate) bool { return string(der) == string(cert.Raw) }
