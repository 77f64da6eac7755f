package v1alpha1

import (
	"encoding/json"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
)

// A node state written by chart 0.2.0's controller (its pods carry their
// compiled rules inline) decodes, marked Outdated, so that a cache listing
// node states during an upgrade does not fail on it; this release's format
// decodes as it is, and what is neither is an error.
func TestNodeStateOfAnEarlierReleaseDecodesOutdated(t *testing.T) {
	const earlier = `{"podCIDRs":["10.244.1.0/24"],
		"paths":[{"name":"fabric-a","index":1,"interface":{"name":"nic1"},"capacity":"10G"}],
		"pods":[{"namespace":"apps","name":"p1","uid":"u1","ips":["10.244.1.11"],
			"rules":[{"policy":"spread","policyGeneration":1,"priority":0,"spreadMode":"roundRobin","maxSubflows":2,
				"subflowCreation":"userspace","dataChecksums":true,"headerRewriting":false}]}]}`
	var old MPTCPNodeStateSpec
	if err := json.Unmarshal([]byte(earlier), &old); err != nil {
		t.Fatalf("an earlier release's spec: %v", err)
	}
	if !old.Outdated() || len(old.Pods) != 1 || old.Pods[0].Name != "p1" || !slices.Equal(old.Pods[0].Rules, RuleNames{OutdatedRule}) || len(old.Paths) != 1 {
		t.Errorf("an earlier release's spec decoded as %+v, want Outdated, its pod and path kept, its rules OutdatedRule", old)
	}

	const current = `{"rules":[{"name":"spread","policy":"spread","policyGeneration":1,"priority":0,"spreadMode":"roundRobin",
		"maxSubflows":2,"subflowCreation":"userspace","dataChecksums":true,"headerRewriting":false}],
		"pods":[{"namespace":"apps","name":"p1","uid":"u1","rules":["spread"]}]}`
	var now MPTCPNodeStateSpec
	if err := json.Unmarshal([]byte(current), &now); err != nil {
		t.Fatal(err)
	}
	if now.Outdated() || len(now.Pods) != 1 || len(now.Pods[0].Rules) != 1 || len(now.Rules) != 1 {
		t.Errorf("this release's spec decoded as %+v", now)
	}

	for _, bad := range []string{`{"pods":[{"rules":[7]}]}`, `{"pods":[{"rules":{}}]}`, `{"pods":"x"}`, `{"paths":[{"index":"one"}]}`} {
		var s MPTCPNodeStateSpec
		if err := json.Unmarshal([]byte(bad), &s); err == nil {
			t.Errorf("%s decoded as %+v, want an error", bad, s)
		}
	}
}

// Only a pod's rule list is lenient: a misspelt field anywhere in a node
// state, inline rules included, is still an error to a strict decoder (the
// agent's file mode).
func TestLenientRuleNamesKeepStrictDecodingStrict(t *testing.T) {
	for _, bad := range []string{
		"spec:\n  pods:\n  - name: p1\n    namespace: apps\n    uid: u1\n    rules: [spread]\n    ipz: [10.0.0.1]\n",
		"spec:\n  rules:\n  - name: spread\n    maxSubflow: 2\n",
	} {
		var s MPTCPNodeState
		if err := yaml.UnmarshalStrict([]byte(bad), &s); err == nil {
			t.Errorf("a misspelt field decoded strictly:\n%s", bad)
		}
	}
}
