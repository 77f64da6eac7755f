package podwebhook

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/mptcp-operator/mptcp-operator/internal/controller/webhookcert"
	"github.com/mptcp-operator/mptcp-operator/internal/transparent"
)

// Options configure the webhook (the controller's -webhook-* flags).
type Options struct {
	// Port serves the webhook over TLS; 0: no webhook.
	Port int
	// Service is the webhook's Service (NAMESPACE/NAME): the
	// certificate's names.
	Service types.NamespacedName
	// CertSecret holds the serving certificate.
	CertSecret types.NamespacedName
	// IssueCert: the controller issues the certificate and keeps the
	// configuration's caBundle; false: cert-manager does.
	IssueCert bool
	// Configuration is the MutatingWebhookConfiguration's name.
	Configuration string
	// PreloadImage holds the preload library (the agent's image).
	PreloadImage      string
	PreloadPullPolicy corev1.PullPolicy
	// ClientCAs, when set, turns mutual TLS on: a caller must present a
	// client certificate these CAs signed (the API server's, which its
	// admission configuration gives it), or the TLS handshake fails;
	// nil: no client certificate is asked for.
	ClientCAs *x509.CertPool
	// ClientNames, with ClientCAs: a client certificate must carry one
	// of them as its CommonName or one of its DNS names; empty: any
	// certificate ClientCAs signed.
	ClientNames []string
}

// LoadClientCAs reads the PEM certificates of file (-webhook-client-ca)
// into a pool for Options.ClientCAs. It is read once: a changed CA takes
// a restart of the controller.
func LoadClientCAs(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate", file)
	}
	return pool, nil
}

// verifyClientName refuses a connection whose client certificate carries
// none of names as its CommonName or a DNS name, for a CA that signs other
// clients' certificates besides the API server's. It runs after the chain
// was verified against ClientCAs, on resumed sessions too.
func verifyClientName(names []string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("no client certificate")
		}
		leaf := cs.PeerCertificates[0]
		if slices.Contains(names, leaf.Subject.CommonName) || slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return slices.Contains(names, n) }) {
			return nil
		}
		return fmt.Errorf("client certificate %q (DNS names %v) is not one of the webhook's allowed names", leaf.Subject.CommonName, leaf.DNSNames)
	}
}

// ParseNamespacedName reads NAMESPACE/NAME.
func ParseNamespacedName(s string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" {
		return types.NamespacedName{}, fmt.Errorf("%q: want NAMESPACE/NAME", s)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// Server returns the webhook server for opts and the certificate manager
// it serves from; the manager must also be added to the controller
// manager (Setup does).
func Server(opts Options, log *slog.Logger) (webhook.Server, *webhookcert.Manager) {
	certs := &webhookcert.Manager{
		Secret: opts.CertSecret,
		DNSNames: []string{
			fmt.Sprintf("%s.%s.svc", opts.Service.Name, opts.Service.Namespace),
			fmt.Sprintf("%s.%s.svc.cluster.local", opts.Service.Name, opts.Service.Namespace),
		},
		Webhook: opts.Configuration,
		Issue:   opts.IssueCert,
		Every:   10 * time.Minute,
		Log:     log,
	}
	srv := newServer("", opts.Port, func(c *tls.Config) {
		c.GetCertificate = certs.GetCertificate
		c.MinVersion = tls.VersionTLS12
		// HTTP/1.1 only: HTTP/2's stream handling has been a way to
		// exhaust servers (CVE-2023-44487), and the API server needs
		// no more.
		c.NextProtos = []string{"http/1.1"}
		if opts.ClientCAs != nil {
			c.ClientAuth = tls.RequireAndVerifyClientCert
			c.ClientCAs = opts.ClientCAs
			if len(opts.ClientNames) > 0 {
				c.VerifyConnection = verifyClientName(opts.ClientNames)
			}
		}
	})
	return srv, certs
}

// Setup registers the webhook with mgr, whose webhook server Server made.
func Setup(mgr ctrl.Manager, opts Options, certs *webhookcert.Manager) error {
	// The Secret and the configuration are read directly: through the
	// manager's cache, reading one Secret would cache every Secret of
	// the cluster.
	direct, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return err
	}
	certs.Client = direct
	if err := mgr.Add(certs); err != nil {
		return err
	}
	// Without ClientCAs the port answers whoever reaches it (with them,
	// whoever holds a certificate they signed): the bounds per source address
	// keep a flood from one address from delaying the API server's
	// reviews, those in all (and the server's on headers) what a flood
	// from many costs.
	mgr.GetWebhookServer().Register(Path, limitSources(&webhook.Admission{Handler: NewMutator(mgr.GetClient(), admission.NewDecoder(mgr.GetScheme()),
		transparent.Injector{Image: opts.PreloadImage, ImagePullPolicy: opts.PreloadPullPolicy,
			Command: []string{"/usr/local/bin/agent", "-install-preload"}})}))
	return mgr.AddReadyzCheck("webhook-certificate", func(*http.Request) error { return certs.Ready() })
}
