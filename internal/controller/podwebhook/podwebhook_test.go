package podwebhook_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/controller"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/podwebhook"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/webhookcert"
	"github.com/mptcp-operator/mptcp-operator/internal/transparent"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

const (
	hookConfig = "mptcp-transparent"
	optInLabel = "mptcp.io/transparent"
)

// startWebhook runs the controller's webhook against env on port, as
// cmd/controller does, until the returned stop.
func startWebhook(t *testing.T, env *testenv.Env, port int) (stop func()) {
	t.Helper()
	opts := podwebhook.Options{Port: port, IssueCert: true, Configuration: hookConfig,
		CertSecret:   types.NamespacedName{Namespace: "mptcp-system", Name: "webhook-cert"},
		PreloadImage: "ghcr.io/mptcp-operator/agent:test", PreloadPullPolicy: corev1.PullIfNotPresent}
	srv, certs := podwebhook.Server(opts, slog.New(slog.DiscardHandler))
	// The API server reaches this process at localhost.
	certs.DNSNames = []string{"localhost"}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Cache: controller.CacheOptions(), WebhookServer: srv,
		Metrics: metricsserver.Options{BindAddress: "0"}, Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := podwebhook.Setup(mgr, opts, certs); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	for deadline := time.Now().Add(30 * time.Second); certs.Ready() != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no webhook certificate within 30 s: %v", certs.Ready())
		}
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return stop
}

// installWebhook creates the Secret and the configuration as the chart
// does: an empty Secret, a configuration without caBundle, calling pods
// in namespaces labelled for it only, failing open.
func installWebhook(t *testing.T, c client.Client, port int) {
	t.Helper()
	ctx := context.Background()
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mptcp-system"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "mptcp-system", Name: "webhook-cert"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: nil, corev1.TLSPrivateKeyKey: nil}},
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: hookConfig},
			Webhooks: []admissionregistrationv1.MutatingWebhook{{
				Name:                    "transparent.mptcp.io",
				ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(fmt.Sprintf("https://localhost:%d%s", port, podwebhook.Path))},
				Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
				NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{optInLabel: "enabled"}},
				FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
				SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
				AdmissionReviewVersions: []string{"v1"},
				TimeoutSeconds:          ptr.To[int32](5),
			}}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
}

func createPod(t *testing.T, c client.Client, ns, name string, labels map[string]string, env ...corev1.EnvVar) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1", Env: env}}}}
	if err := c.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

// warnings records the API server's warnings to a client.
type warnings struct{ texts []string }

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) { w.texts = append(w.texts, text) }

func godebug(pod *corev1.Pod) string {
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == "GODEBUG" {
			return e.Value
		}
	}
	return ""
}

// Through a real API server: the controller issues its certificate and
// puts it in the configuration's caBundle; a pod created in a namespace
// that opted in, selected by a policy that sets transparent, is changed as
// the policy says (the policy of highest precedence that sets it decides);
// pods elsewhere, or not selected, or whose policy sets nothing or kernel
// (the agent's), are not;
// with the webhook down, pods are admitted unchanged.
func TestPodsAreChangedAsTheirPolicySaysThroughTheAPIServer(t *testing.T) {
	env := testenv.Start(t)
	c, ctx := env.Client, context.Background()
	port := testutil.FreePort(t)
	installWebhook(t, c, port)
	stop := startWebhook(t, env, port)

	var cfg admissionregistrationv1.MutatingWebhookConfiguration
	if err := c.Get(ctx, client.ObjectKey{Name: hookConfig}, &cfg); err != nil || len(cfg.Webhooks[0].ClientConfig.CABundle) == 0 {
		t.Fatalf("caBundle not set by the controller (%v)", err)
	}

	optedIn := env.Namespace(t, "apps", map[string]string{optInLabel: "enabled", "tenant": "a"})
	notOptedIn := env.Namespace(t, "others", map[string]string{"tenant": "a"})
	policy := func(name string, prio int32, podLabels map[string]string, mode mptcpv1alpha1.TransparentMPTCP) {
		p := &mptcpv1alpha1.MPTCPPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: mptcpv1alpha1.MPTCPPolicySpec{
			Priority:          prio,
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "a"}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: podLabels},
			Spread:            mptcpv1alpha1.Spread{Paths: []mptcpv1alpha1.WeightedPath{{Name: "fabric-a"}}},
			PodMPTCP:          mptcpv1alpha1.PodMPTCP{Transparent: mode}}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	policy("inject-apps", 0, map[string]string{"app": "web"}, mptcpv1alpha1.TransparentInject)
	policy("off-legacy", 10, map[string]string{"app": "web", "legacy": "yes"}, mptcpv1alpha1.TransparentOff)
	policy("spread-only", 20, map[string]string{"app": "db"}, "")
	policy("kernel-batch", 30, map[string]string{"app": "batch"}, mptcpv1alpha1.TransparentKernel)

	// The cache may not hold the policies yet: the first pod retries.
	var web *corev1.Pod
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		web = createPod(t, c, optedIn, fmt.Sprintf("web-%d", time.Now().UnixNano()), map[string]string{"app": "web"},
			corev1.EnvVar{Name: "GODEBUG", Value: "http2client=0"})
		if web.Annotations[transparent.AnnotationMode] != "" || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("web pod %s changed", web.Name)
	if got := godebug(web); got != "http2client=0,multipathtcp=1" || web.Annotations[transparent.AnnotationPolicy] != "inject-apps" ||
		len(web.Spec.InitContainers) != 1 || web.Spec.InitContainers[0].Name != transparent.InitContainerName {
		t.Errorf("web pod: GODEBUG %q, annotations %v, init containers %d; want inject from inject-apps", got, web.Annotations, len(web.Spec.InitContainers))
	}
	legacy := createPod(t, c, optedIn, "legacy", map[string]string{"app": "web", "legacy": "yes"})
	if got := godebug(legacy); got != "multipathtcp=0" || len(legacy.Spec.InitContainers) != 0 {
		t.Errorf("legacy pod (off-legacy takes precedence): GODEBUG %q, init containers %v", got, legacy.Spec.InitContainers)
	}
	// kernel is the agent's: the webhook admits the pod as it is, and
	// without the warning it gives a pod it could not change.
	warned := &warnings{}
	warnedCfg := rest.CopyConfig(env.Config)
	warnedCfg.WarningHandler = warned
	wc, err := client.New(warnedCfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	batch := createPod(t, wc, optedIn, "batch", map[string]string{"app": "batch"})
	if len(warned.texts) != 0 {
		t.Errorf("creating a pod whose policy says kernel warned: %q", warned.texts)
	}
	for _, p := range []*corev1.Pod{
		createPod(t, c, optedIn, "db", map[string]string{"app": "db"}),
		batch,
		createPod(t, c, optedIn, "unselected", map[string]string{"app": "cache"}),
		createPod(t, c, notOptedIn, "web", map[string]string{"app": "web"}),
	} {
		if _, ok := p.Annotations[transparent.AnnotationMode]; ok || godebug(p) != "" || len(p.Spec.InitContainers) != 0 {
			t.Errorf("pod %s/%s was changed: %v %+v", p.Namespace, p.Name, p.Annotations, p.Spec)
		}
	}

	// Down: admitted as they are, in time.
	stop()
	start := time.Now()
	down := createPod(t, c, optedIn, "while-down", map[string]string{"app": "web"})
	if _, ok := down.Annotations[transparent.AnnotationMode]; ok {
		t.Errorf("a pod was changed with the webhook down")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("creating a pod with the webhook down took %v", d)
	}
}

// The certificate is renewed when a third of its validity is left; the
// caBundle then holds the new one and the one it replaces, for an hour
// (webhookcert.KeepPrevious: every replica has read the Secret again by
// then), and then the new one alone.
func TestTheCertificateIsRenewedAndBothAreTrustedMeanwhile(t *testing.T) {
	env := testenv.Start(t)
	c, ctx := env.Client, context.Background()
	port := testutil.FreePort(t)
	installWebhook(t, c, port)
	opts := podwebhook.Options{Port: port, IssueCert: true, Configuration: hookConfig,
		CertSecret: types.NamespacedName{Namespace: "mptcp-system", Name: "webhook-cert"}}
	_, certs := podwebhook.Server(opts, slog.New(slog.DiscardHandler))
	certs.Client = c
	if err := certs.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	first := certsInBundle(t, c)
	if len(first) != 1 {
		t.Fatalf("caBundle holds %d certificates after the first issue, want 1", len(first))
	}
	if err := certs.Sync(ctx); err != nil || len(certsInBundle(t, c)) != 1 {
		t.Fatalf("a second sync changed the bundle (%v)", err)
	}
	certs.Now = func() time.Time { return time.Now().Add(250 * 24 * time.Hour) }
	if err := certs.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	renewed := certsInBundle(t, c)
	if len(renewed) != 2 || !renewed[1].Equal(first[0]) || renewed[0].NotAfter.Before(first[0].NotAfter) {
		t.Errorf("after renewal the bundle holds %d certificates; want the new one, then the old one", len(renewed))
	}
	got, err := certs.GetCertificate(nil)
	if err != nil || !strings.EqualFold(string(got.Certificate[0]), string(renewed[0].Raw)) {
		t.Errorf("the served certificate is not the renewed one (%v)", err)
	}
	if len(renewed) != 2 {
		return
	}
	for _, step := range []struct {
		after time.Duration
		want  []*x509.Certificate
	}{
		{webhookcert.KeepPrevious - 5*time.Minute, renewed},
		{webhookcert.KeepPrevious + 5*time.Minute, renewed[:1]},
	} {
		certs.Now = func() time.Time { return time.Now().Add(250*24*time.Hour + step.after) }
		if err := certs.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		got := certsInBundle(t, c)
		same := len(got) == len(step.want)
		for i := 0; same && i < len(got); i++ {
			same = got[i].Equal(step.want[i])
		}
		if !same {
			t.Errorf("%v after the renewal the caBundle holds %d certificates, want %d (the new one first)", step.after, len(got), len(step.want))
		}
	}
}

func certsInBundle(t *testing.T, c client.Client) []*x509.Certificate {
	t.Helper()
	var cfg admissionregistrationv1.MutatingWebhookConfiguration
	if err := c.Get(context.Background(), client.ObjectKey{Name: hookConfig}, &cfg); err != nil {
		t.Fatal(err)
	}
	var out []*x509.Certificate
	rest := cfg.Webhooks[0].ClientConfig.CABundle
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return out
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, cert)
	}
}

// The chart's objects for the webhook, applied to a real API server, with
// the controller impersonated: its RBAC lets it keep the caBundle of the
// chart's webhook configuration, and the chart's admission policy lets it
// change nothing else of it (a stolen controller token cannot point the
// webhook elsewhere, widen what it sees, or make it fail closed); no other
// webhook configuration is its to change.
func TestTheControllerMayChangeOnlyTheCABundle(t *testing.T) {
	env := testenv.Start(t)
	c, ctx := env.Client, context.Background()
	env.Namespace(t, "mptcp-system", nil)
	for _, obj := range testenv.Objects(t, filepath.Join(testenv.RepoRoot(), "config", "webhook", "webhook.yaml")) {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("create %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	other := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "someone-elses"}}
	if err := c.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: testenv.ControllerUser, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	asController, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	updateAs := func(c client.Client, edit func(*admissionregistrationv1.MutatingWebhookConfiguration)) error {
		var hook admissionregistrationv1.MutatingWebhookConfiguration
		if err := c.Get(ctx, client.ObjectKey{Name: "mptcp-transparent"}, &hook); err != nil {
			return err
		}
		edit(&hook)
		return c.Update(ctx, &hook)
	}
	update := func(edit func(*admissionregistrationv1.MutatingWebhookConfiguration)) error {
		return updateAs(asController, edit)
	}
	// The admission policy takes effect asynchronously: the first
	// forbidden change is tried until it is refused.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err := update(func(h *admissionregistrationv1.MutatingWebhookConfiguration) {
			h.Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Fail)
		})
		if err != nil && strings.Contains(err.Error(), "may change only the caBundle") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("making the webhook fail closed: %v, want the admission policy's refusal", err)
		}
		if err == nil {
			// Allowed before the policy took effect: put it back, as
			// the admin (the policy may have taken effect since, and
			// it refuses the controller this change too).
			if err := updateAs(c, func(h *admissionregistrationv1.MutatingWebhookConfiguration) {
				h.Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := update(func(h *admissionregistrationv1.MutatingWebhookConfiguration) {
		h.Webhooks[0].ClientConfig.CABundle = []byte("x")
	}); err != nil {
		t.Errorf("keeping the caBundle: %v", err)
	}
	for name, edit := range map[string]func(*admissionregistrationv1.MutatingWebhookConfiguration){
		"point it at another service": func(h *admissionregistrationv1.MutatingWebhookConfiguration) {
			h.Webhooks[0].ClientConfig.Service.Name = "elsewhere"
		},
		"point it at a URL": func(h *admissionregistrationv1.MutatingWebhookConfiguration) {
			h.Webhooks[0].ClientConfig.Service, h.Webhooks[0].ClientConfig.URL = nil, ptr.To("https://evil.example/")
		},
		"see every namespace": func(h *admissionregistrationv1.MutatingWebhookConfiguration) {
			h.Webhooks[0].NamespaceSelector = &metav1.LabelSelector{}
		},
		"see more resources": func(h *admissionregistrationv1.MutatingWebhookConfiguration) {
			h.Webhooks[0].Rules[0].Resources = []string{"*"}
		},
		"add a webhook": func(h *admissionregistrationv1.MutatingWebhookConfiguration) {
			w := h.Webhooks[0]
			w.Name = "another.mptcp.io"
			h.Webhooks = append(h.Webhooks, w)
		},
		"relabel it": func(h *admissionregistrationv1.MutatingWebhookConfiguration) { h.Labels["x"] = "y" },
	} {
		if err := update(edit); err == nil {
			t.Errorf("%s: allowed", name)
		}
	}
	if err := asController.Get(ctx, client.ObjectKeyFromObject(other), other); !apierrors.IsForbidden(err) {
		t.Errorf("the controller reading another webhook configuration: %v, want forbidden", err)
	}
	other.Webhooks = nil
	if err := asController.Update(ctx, other); !apierrors.IsForbidden(err) {
		t.Errorf("the controller updating another webhook configuration: %v, want forbidden", err)
	}
}
