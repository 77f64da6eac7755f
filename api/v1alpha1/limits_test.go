package v1alpha1_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// crdSchema is the OpenAPI schema of the first version of a generated CRD.
func crdSchema(t *testing.T, file string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", file))
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &crd); err != nil || len(crd.Spec.Versions) == 0 {
		t.Fatalf("%s: %v", file, err)
	}
	return crd.Spec.Versions[0].Schema.OpenAPIV3Schema
}

// schemaAt walks a schema along a dotted field path; "[]" steps into a
// list's items.
func schemaAt(t *testing.T, s map[string]any, path string) map[string]any {
	t.Helper()
	for _, step := range strings.Split(path, ".") {
		var next any
		if step == "[]" {
			next = s["items"]
		} else if props, ok := s["properties"].(map[string]any); ok {
			next = props[step]
		}
		m, ok := next.(map[string]any)
		if !ok {
			t.Fatalf("no schema at %s (stuck at %q)", path, step)
		}
		s = m
	}
	return s
}

// celRules are the x-kubernetes-validations rules of a schema.
func celRules(s map[string]any) []string {
	var out []string
	vs, _ := s["x-kubernetes-validations"].([]any)
	for _, v := range vs {
		if m, ok := v.(map[string]any); ok {
			out = append(out, fmt.Sprint(m["rule"]))
		}
	}
	return out
}

// Every limit the schema states is the datapath's: the markers and CEL rules
// are literals (controller-gen needs them so), and this compares each number
// in the generated CRDs with the datapath's Go constant (package limits,
// which TestLimitsAreTheCEnum in internal/datapath checks against C), so
// that a change on either side fails here instead of being accepted by the
// API and refused by every agent.
func TestSchemaLimitsAreTheDatapaths(t *testing.T) {
	// The API's constants are the datapath's.
	for name, c := range map[string]struct{ api, datapath int }{
		"path index":       {mptcpv1alpha1.MaxPathIndex, datapath.MaxPaths},
		"paths per policy": {mptcpv1alpha1.MaxPolicyPaths, datapath.MaxPaths},
		"port ranges":      {mptcpv1alpha1.MaxPortRanges, datapath.MaxRulePorts},
		"CIDRs":            {mptcpv1alpha1.MaxCIDRs, datapath.MaxRuleCIDRs},
		"subflows":         {mptcpv1alpha1.MaxSubflows, datapath.MaxSubflows},
		"weight":           {mptcpv1alpha1.MaxWeight, datapath.MaxWeight},
		"policies per pod": {mptcpv1alpha1.MaxPodPolicies, datapath.MaxPodRules},
		"burst floor":      {mptcpv1alpha1.MinBurstBytes, datapath.MinBurstBytes},
		"burst ceiling":    {mptcpv1alpha1.MaxBurstBytes, datapath.MaxBurstBytes},
	} {
		if c.api != c.datapath {
			t.Errorf("%s: the API says %d, the datapath %d", name, c.api, c.datapath)
		}
	}

	paths := crdSchema(t, "mptcp.io_mptcppaths.yaml")
	policies := crdSchema(t, "mptcp.io_mptcppolicies.yaml")
	states := crdSchema(t, "mptcp.io_mptcpnodestates.yaml")
	cases := []struct {
		schema map[string]any
		field  string // dotted path in the CRD's schema
		key    string // maximum or maxItems
		want   int
	}{
		{paths, "status.index", "maximum", mptcpv1alpha1.MaxPathIndex},
		{paths, "spec.weight", "maximum", mptcpv1alpha1.MaxWeight},
		{states, "spec.paths.[].index", "maximum", mptcpv1alpha1.MaxPathIndex},
		{states, "spec.pods.[].rules", "maxItems", mptcpv1alpha1.MaxPodPolicies},
		{states, "status.paths", "maxItems", mptcpv1alpha1.MaxPathIndex},
		{policies, "spec.spread.paths", "maxItems", mptcpv1alpha1.MaxPolicyPaths},
		{policies, "spec.spread.paths.[].weight", "maximum", mptcpv1alpha1.MaxWeight},
		{policies, "spec.backupPaths", "maxItems", mptcpv1alpha1.MaxPolicyPaths},
		{policies, "spec.blockedPaths", "maxItems", mptcpv1alpha1.MaxPolicyPaths},
		{policies, "spec.rateLimits.perPath", "maxItems", mptcpv1alpha1.MaxPolicyPaths},
		{policies, "spec.traffic.ports", "maxItems", mptcpv1alpha1.MaxPortRanges},
		{policies, "spec.traffic.cidrs", "maxItems", mptcpv1alpha1.MaxCIDRs},
		{policies, "spec.maxSubflows", "maximum", mptcpv1alpha1.MaxSubflows},
		{policies, "spec.podMPTCP.signalPorts", "maxItems", mptcpv1alpha1.MaxSignalPorts},
		{states, "spec.rules.[].joinAfterBytes", "maximum", mptcpv1alpha1.MaxJoinAfterBytes},
		{policies, "spec.podMPTCP.congestionControl", "maxLength", mptcpv1alpha1.MaxCongestionControlName},
		{states, "spec.rules.[].congestionControl", "maxLength", mptcpv1alpha1.MaxCongestionControlName},
		{states, "status.congestionControls.[].name", "maxLength", mptcpv1alpha1.MaxCongestionControlName},
	}
	for _, c := range cases {
		got, ok := schemaAt(t, c.schema, c.field)[c.key].(float64)
		if !ok || int(got) != c.want {
			t.Errorf("%s: %s is %v in the CRD, want %d (the datapath's limit)", c.field, c.key, got, c.want)
		}
	}

	// CEL: spread and backup paths together fit a rule's path list.
	sum := fmt.Sprintf("size(self.spread.paths) + (has(self.backupPaths) ? size(self.backupPaths) : 0) <= %d", mptcpv1alpha1.MaxPolicyPaths)
	if rules := celRules(schemaAt(t, policies, "spec")); !slices.Contains(rules, sum) {
		t.Errorf("spec has no rule %q: %q", sum, rules)
	}
	// CEL: the burst's bounds, as quantities.
	burst := celRules(schemaAt(t, policies, "spec.rateLimits.burst"))
	for _, want := range []int{mptcpv1alpha1.MinBurstBytes, mptcpv1alpha1.MaxBurstBytes} {
		q := resource.NewQuantity(int64(want), resource.BinarySI).String()
		if len(burst) != 1 || !strings.Contains(burst[0], "quantity('"+q+"')") {
			t.Errorf("spec.rateLimits.burst: rules %q do not bound it by %s (%d bytes)", burst, q, want)
		}
	}
	// The congestion control a policy that names none gets is the one the
	// controller compiles for it.
	if got := schemaAt(t, policies, "spec.podMPTCP.congestionControl")["default"]; got != mptcpv1alpha1.DefaultCongestionControl {
		t.Errorf("spec.podMPTCP.congestionControl: default %v in the CRD, want %s", got, mptcpv1alpha1.DefaultCongestionControl)
	}
	// CEL: the join threshold's bound, as a quantity.
	threshold := celRules(schemaAt(t, policies, "spec.podMPTCP.joinAfterBytes"))
	q := resource.NewQuantity(mptcpv1alpha1.MaxJoinAfterBytes, resource.BinarySI).String()
	if len(threshold) != 1 || !strings.Contains(threshold[0], "quantity('"+q+"')") {
		t.Errorf("spec.podMPTCP.joinAfterBytes: rules %q do not bound it by %s (%d bytes)", threshold, q, mptcpv1alpha1.MaxJoinAfterBytes)
	}
}
