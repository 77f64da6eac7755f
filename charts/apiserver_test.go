package charts

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// A real kube-apiserver (the pinned version the tests build) accepts the
// whole chart with every optional part on: its CRDs, its RBAC, its admission
// policies (CEL compiled by the server), the workloads' security contexts and
// host paths as the API validates them, and the MPTCPPaths and MPTCPPolicies
// from values against the CRDs' schemas and CEL rules. Objects are applied
// server-side in the order helm renders them (CRDs first), as `helm install`
// does.
func aRealAPIServerAcceptsTheChart(t *testing.T) {
	r := render(t, "-f", everythingValues())
	env := testenv.Start(t)
	ctx := context.Background()
	env.Namespace(t, namespace, nil)
	env.Namespace(t, "monitoring", nil) // where everything-values puts the dashboard
	applied := 0
	for _, k := range r.order {
		if strings.HasPrefix(k, "ServiceMonitor/") || strings.HasPrefix(k, "PrometheusRule/") {
			// Their CRDs are the Prometheus Operator's, not installed here;
			// the render tests check their fields.
			continue
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(r.raw[k], &u.Object); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("helm"), client.ForceOwnership); err != nil {
			t.Errorf("the API server refuses %s: %v", k, err)
			continue
		}
		applied++
	}
	if applied < 20 {
		t.Errorf("applied %d objects; the chart renders more (%v)", applied, r.order)
	}
}
