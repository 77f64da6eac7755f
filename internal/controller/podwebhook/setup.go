package podwebhook

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
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
	// The port answers whoever reaches it: the bounds per source address
	// keep a flood from one address from delaying the API server's
	// reviews, those in all (and the server's on headers) what a flood
	// from many costs.
	mgr.GetWebhookServer().Register(Path, limitSources(&webhook.Admission{Handler: NewMutator(mgr.GetClient(), admission.NewDecoder(mgr.GetScheme()),
		transparent.Injector{Image: opts.PreloadImage, ImagePullPolicy: opts.PreloadPullPolicy,
			Command: []string{"/usr/local/bin/agent", "-install-preload"}})}))
	return mgr.AddReadyzCheck("webhook-certificate", func(*http.Request) error { return certs.Ready() })
}
