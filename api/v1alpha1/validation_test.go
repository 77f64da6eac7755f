package v1alpha1_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// validPolicy is the base most policy cases change in one place.
const validPolicySpec = `
  namespaceSelector: {}
  spread:
    paths:
      - name: fabric-a
`

// TestInvalidManifestsAreRejected sends manifests the schema and its CEL rules
// must refuse to a real API server, and checks that the error names the
// offending field, so an admin knows what to fix.
func TestInvalidManifestsAreRejected(t *testing.T) {
	env := testenv.Start(t)

	cases := map[string]struct {
		manifest string // YAML of one object
		field    string // field path the API server's message must name
		message  string // part of the message that explains the rule
	}{
		"path without interface": {
			manifest: `
kind: MPTCPPath
metadata: {name: p}
spec: {interface: {}, capacity: 1G}`,
			field: "spec.interface", message: "exactly one of name, pattern or altName",
		},
		"path with interface name and pattern": {
			manifest: `
kind: MPTCPPath
metadata: {name: p}
spec: {interface: {name: nic1, pattern: "nic*"}, capacity: 1G}`,
			field: "spec.interface", message: "exactly one of name, pattern or altName",
		},
		"path interface name longer than IFNAMSIZ": {
			manifest: `
kind: MPTCPPath
metadata: {name: p}
spec: {interface: {name: nic0123456789abc}, capacity: 1G}`,
			field: "spec.interface.name", message: "15",
		},
		"path interface name with a slash": {
			manifest: `
kind: MPTCPPath
metadata: {name: p}
spec: {interface: {name: "a/b"}, capacity: 1G}`,
			field: "spec.interface.name", message: "should match",
		},
		"path with zero capacity": {
			manifest: `
kind: MPTCPPath
metadata: {name: p}
spec: {interface: {name: nic1}, capacity: "0"}`,
			field: "spec.capacity", message: "capacity must be a positive whole number",
		},
		"path without capacity": {
			manifest: `
kind: MPTCPPath
metadata: {name: p}
spec: {interface: {name: nic1}}`,
			field: "spec.capacity", message: "Required value",
		},
		"path with unknown role": {
			manifest: `
kind: MPTCPPath
metadata: {name: p}
spec: {interface: {name: nic1}, capacity: 1G, defaultRole: primary}`,
			field: "spec.defaultRole", message: "Unsupported value",
		},
		"path with weight zero": {
			manifest: `
kind: MPTCPPath
metadata: {name: p}
spec: {interface: {name: nic1}, capacity: 1G, weight: 0}`,
			field: "spec.weight", message: "greater than or equal to 1",
		},
		"path named with a dot": {
			manifest: `
kind: MPTCPPath
metadata: {name: fabric.a}
spec: {interface: {name: nic1}, capacity: 1G}`,
			field: "metadata.name", message: "must be a DNS label",
		},
		"policy without namespaceSelector": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec: {spread: {paths: [{name: fabric-a}]}}`,
			field: "spec.namespaceSelector", message: "Required value",
		},
		"policy spreading over no path": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec: {namespaceSelector: {}, spread: {paths: []}}`,
			field: "spec.spread.paths", message: "at least 1 items",
		},
		"policy spreading twice over one path": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec: {namespaceSelector: {}, spread: {paths: [{name: fabric-a}, {name: fabric-a}]}}`,
			field: "spec.spread.paths[1]", message: "Duplicate value",
		},
		"policy with weight above 255": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec: {namespaceSelector: {}, spread: {paths: [{name: fabric-a, weight: 256}]}}`,
			field: "spec.spread.paths[0].weight", message: "less than or equal to 255",
		},
		"policy spreading over more paths than a node has": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:
  namespaceSelector: {}
  spread: {paths: [{name: p1}, {name: p2}, {name: p3}, {name: p4}, {name: p5}, {name: p6}, {name: p7}, {name: p8},
    {name: p9}, {name: p10}, {name: p11}, {name: p12}, {name: p13}, {name: p14}, {name: p15}, {name: p16}]}`,
			field: "spec.spread.paths", message: "must have at most 15 items",
		},
		"policy whose spread and backup paths exceed a node's paths": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:
  namespaceSelector: {}
  headerRewriting: Allowed
  spread: {paths: [{name: p1}, {name: p2}, {name: p3}, {name: p4}, {name: p5}, {name: p6}, {name: p7}, {name: p8}]}
  backupPaths: [b1, b2, b3, b4, b5, b6, b7, b8]`,
			field: "spec", message: "at most 15 paths together",
		},
		"policy with unknown spread mode": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec: {namespaceSelector: {}, spread: {mode: random, paths: [{name: fabric-a}]}}`,
			field: "spec.spread.mode", message: "Unsupported value",
		},
		"policy with nine subflows": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  maxSubflows: 9`,
			field: "spec.maxSubflows", message: "less than or equal to 8",
		},
		"policy with priority out of range": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  priority: 5000`,
			field: "spec.priority", message: "less than or equal to 1000",
		},
		"policy with a malformed CIDR": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  traffic: {cidrs: ["10.0.0.0/33"]}`,
			field: "spec.traffic", message: "cidrs: 10.0.0.0/33 is not a CIDR",
		},
		"policy with CIDR of the other family": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  traffic: {family: IPv6, cidrs: ["10.0.0.0/8"]}`,
			field: "spec.traffic", message: "address family given in family",
		},
		"policy with unknown family": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  traffic: {family: IPv5}`,
			field: "spec.traffic.family", message: "Unsupported value",
		},
		"policy with port zero": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  traffic: {ports: [{port: 0}]}`,
			field: "spec.traffic.ports[0].port", message: "greater than or equal to 1",
		},
		"policy with more port ranges than a rule selects": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  traffic: {ports: [{port: 1}, {port: 2}, {port: 3}, {port: 4}, {port: 5}, {port: 6}, {port: 7}, {port: 8}, {port: 9}]}`,
			field: "spec.traffic.ports", message: "must have at most 8 items",
		},
		"policy with an IPv4-mapped IPv6 CIDR": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  traffic: {cidrs: ["::ffff:10.0.0.0/104"]}`,
			field: "spec.traffic", message: "cidrs: ::ffff:10.0.0.0/104 is not a CIDR",
		},
		"policy with a port range ending below its start": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  traffic: {ports: [{port: 8080, endPort: 80}]}`,
			field: "spec.traffic", message: "ports: endPort must not be below port",
		},
		"policy blocking a path it spreads over": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  blockedPaths: [fabric-a]`,
			field: "spec", message: "blockedPaths must not name a path of spread.paths",
		},
		"policy with a backup path it also spreads over": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  headerRewriting: Allowed
  backupPaths: [fabric-a]`,
			field: "spec", message: "backupPaths must not name a path of spread.paths",
		},
		"policy blocking its backup path": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  headerRewriting: Allowed
  backupPaths: [lte]
  blockedPaths: [lte]`,
			field: "spec", message: "blockedPaths must not name a path of backupPaths",
		},
		"policy with a spread path of role backup but no header rewriting opt-in": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec: {namespaceSelector: {}, spread: {paths: [{name: fabric-a}, {name: lte, role: backup}]}}`,
			field: "spec", message: "role backup is flagged backup",
		},
		"policy with backup paths but no header rewriting opt-in": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  backupPaths: [lte]`,
			field: "spec", message: "need headerRewriting: Allowed",
		},
		"policy with window rate limit but no header rewriting opt-in": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: window, perConnection: 100M}`,
			field: "spec", message: "rateLimits.mode window rewrites the TCP window",
		},
		"policy capping a path with the receive window": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  headerRewriting: Allowed
  rateLimits: {mode: window, perPath: [{path: fabric-a, rate: 1G}]}`,
			field: "spec.rateLimits", message: "mode window caps connections only",
		},
		"policy capping a pod with the receive window": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  headerRewriting: Allowed
  rateLimits: {mode: window, perConnection: 100M, perPod: 1G}`,
			field: "spec.rateLimits", message: "mode window caps connections only",
		},
		"policy shaping a connection": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: shape, perConnection: 100M}`,
			field: "spec.rateLimits", message: "mode shape queues per pod, per namespace and per path",
		},
		"policy with a direction outside police": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: shape, perPod: 100M, direction: ingress}`,
			field: "spec.rateLimits", message: "direction is for mode police only",
		},
		"policy with a rate below one bit per second": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: police, perConnection: 100m}`,
			field: "spec.rateLimits.perConnection", message: "whole number of bits per second",
		},
		"policy with a fractional path rate": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: police, perPath: [{path: fabric-a, rate: 1500m}]}`,
			field: "spec.rateLimits.perPath[0].rate", message: "whole number of bits per second",
		},
		"policy with a burst below the floor": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: police, perPod: 1G, burst: 1Ki}`,
			field: "spec.rateLimits.burst", message: "from 64Ki to 1Gi",
		},
		"policy with an unbounded burst": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: police, perPod: 1G, burst: 5Gi}`,
			field: "spec.rateLimits.burst", message: "from 64Ki to 1Gi",
		},
		"path with a capacity below one bit per second": {
			manifest: `
kind: MPTCPPath
metadata: {name: p}
spec: {interface: {name: nic1}, capacity: 100m}`,
			field: "spec.capacity", message: "whole number of bits per second",
		},
		"policy capping a path it does not use": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: police, perPath: [{path: fabric-z, rate: 1G}]}`,
			field: "spec", message: "rateLimits.perPath must name paths of spread.paths or backupPaths",
		},
		"policy with a negative pod rate": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: police, perPod: "-1M"}`,
			field: "spec.rateLimits.perPod", message: "perPod must be a positive whole number",
		},
		"policy with rate limits that limit nothing": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: police}`,
			field: "spec.rateLimits", message: "at least one of perConnection, perPod, perNamespace or perPath",
		},
		// Rates are bits per second, written in decimal SI: 5Gi would
		// be 5.37e9 bit/s, a binary prefix that reads as bytes.
		"policy with a binary per-pod rate": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: police, perPod: 5Gi}`,
			field: "spec.rateLimits.perPod", message: "write a decimal SI quantity (e.g. 5G, 100M), not a binary one",
		},
		"policy with a binary per-connection rate": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: police, perConnection: 100Mi}`,
			field: "spec.rateLimits.perConnection", message: "perConnection is in bits per second",
		},
		"policy with a binary per-namespace rate": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: shape, perNamespace: 1Gi}`,
			field: "spec.rateLimits.perNamespace", message: "perNamespace is in bits per second",
		},
		"policy with a binary path rate": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: police, perPath: [{path: fabric-a, rate: 50Mi}]}`,
			field: "spec.rateLimits.perPath[0].rate", message: "rate is in bits per second",
		},
		"path with a binary capacity": {
			manifest: `
kind: MPTCPPath
metadata: {name: p}
spec: {interface: {name: nic1}, capacity: 10Gi}`,
			field: "spec.capacity", message: "capacity is in bits per second",
		},
		"policy with a zero per-namespace rate": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  rateLimits: {mode: police, perNamespace: "0"}`,
			field: "spec.rateLimits.perNamespace", message: "perNamespace must be a positive whole number",
		},
		"policy capping a namespace with the receive window": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  headerRewriting: Allowed
  rateLimits: {mode: window, perConnection: 100M, perNamespace: 1G}`,
			field: "spec.rateLimits", message: "mode window caps connections only",
		},
		"policy in signal mode without ports": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  podMPTCP: {subflowCreation: signal}`,
			field: "spec.podMPTCP", message: "signalPorts must be set when subflowCreation is signal",
		},
		"policy with signal ports in userspace mode": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  podMPTCP: {subflowCreation: userspace, signalPorts: [4000]}`,
			field: "spec.podMPTCP", message: "signalPorts must be set when subflowCreation is signal",
		},
		"path with a shared-risk group that is no DNS label": {
			manifest: `
kind: MPTCPPath
metadata: {name: fabric-a}
spec: {interface: {name: nic1}, capacity: 10G, sharedRiskGroup: Rack_1}`,
			field: "spec.sharedRiskGroup", message: "should match",
		},
		"policy with a join threshold in signal mode": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  podMPTCP: {subflowCreation: signal, signalPorts: [4000], joinAfterBytes: 64Ki}`,
			field: "spec.podMPTCP", message: "joinAfterBytes holds back the joins the agent opens",
		},
		"policy with a negative join threshold": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  podMPTCP: {joinAfterBytes: -1}`,
			field: "spec.podMPTCP.joinAfterBytes", message: "from 0 to 1Gi",
		},
		"policy with a join threshold past a gibibyte": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  podMPTCP: {joinAfterBytes: 2Gi}`,
			field: "spec.podMPTCP.joinAfterBytes", message: "from 0 to 1Gi",
		},
		"policy with a fractional join threshold": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  podMPTCP: {joinAfterBytes: 100m}`,
			field: "spec.podMPTCP.joinAfterBytes", message: "whole number of bytes",
		},
		"policy with an unknown tenant preference permission": {
			manifest: `
kind: MPTCPPolicy
metadata: {name: p}
spec:` + validPolicySpec + `
  tenantPreferences: Sometimes`,
			field: "spec.tenantPreferences", message: "Unsupported value",
		},
		"node state with a path index of zero": {
			manifest: `
kind: MPTCPNodeState
metadata: {name: node-1}
spec:
  paths:
    - {name: fabric-a, index: 0, interface: {name: nic1}, role: active, weight: 1, capacity: 1G}`,
			field: "spec.paths[0].index", message: "greater than or equal to 1",
		},
		"node state with a path index beyond the mark's": {
			manifest: `
kind: MPTCPNodeState
metadata: {name: node-1}
spec:
  paths:
    - {name: fabric-a, index: 16, interface: {name: nic1}, role: active, weight: 1, capacity: 1G}`,
			field: "spec.paths[0].index", message: "less than or equal to 15",
		},
	}

	ctx := context.Background()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			obj := decode(t, "apiVersion: mptcp.io/v1alpha1\n"+strings.TrimPrefix(tc.manifest, "\n"))
			err := env.Client.Create(ctx, obj)
			if err == nil {
				_ = env.Client.Delete(ctx, obj)
				t.Fatalf("the API server accepted an invalid %s", obj.GetKind())
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want an Invalid error, got %v", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.field) || !strings.Contains(msg, tc.message) {
				t.Fatalf("error does not name field %q with %q:\n%s", tc.field, tc.message, msg)
			}
		})
	}
}

// TestExamplesAreAccepted applies every manifest of examples/ to a real API
// server: the examples are documentation, so they must stay valid.
func TestExamplesAreAccepted(t *testing.T) {
	env := testenv.Start(t)
	files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "examples", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples found: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			objs := testenv.Objects(t, f)
			for _, obj := range objs {
				if err := env.Client.Create(context.Background(), obj); err != nil {
					t.Errorf("%s %s rejected: %v", obj.GetKind(), obj.GetName(), err)
				}
			}
			if len(objs) == 0 {
				t.Fatalf("%s holds no object", f)
			}
		})
	}
}

func decode(t *testing.T, manifest string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(manifest), &obj.Object); err != nil {
		t.Fatalf("bad test manifest: %v\n%s", err, manifest)
	}
	return obj
}
