package v1alpha1

import (
	"encoding/json"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// The node state uses the policy's and path's types as they are: their CEL
// rules sit on the fields of MPTCPPolicySpec and MPTCPPathSpec, not on the
// types, so the node state (whose only writer, the controller, copies
// values already validated) carries none, and its unbounded lists stay
// within the API server's CEL cost budget.

// NodePath is a path resolved for one node.
type NodePath struct {
	// name of the MPTCPPath.
	Name string `json:"name"`

	// index is the path's cluster-wide index (MPTCPPath status.index), the
	// same on every node so that marks agree: the mark's value and the
	// offset of the path's routing table.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=15
	Index int32 `json:"index"`

	// interface is how the agent finds the path's interface on this node.
	// The controller cannot see a node's interfaces; the agent reports the
	// one it found (or none) in status.paths.
	Interface InterfaceSelector `json:"interface"`

	// capacity in bits per second: the agent bounds every per-path cap
	// and the path NIC's shaping by it. (The path's default role and
	// weight are resolved into the rules.)
	Capacity resource.Quantity `json:"capacity"`

	// sharedRiskGroup is the path's (MPTCPPath spec.sharedRiskGroup):
	// paths with the same one share a bottleneck or a failure.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	SharedRiskGroup string `json:"sharedRiskGroup,omitempty"`

	// addresses are the node's addresses on this path that the controller
	// gave it, from those its agent reports (status.paths) and that other
	// nodes' peers list. An address two nodes report stays with the node
	// whose spec has it already, so a node that reports another node's
	// address later never takes it; where neither spec has it yet, or
	// both do, the node of the older node state (creationTimestamp, then
	// name) has it. The agent does not read them.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4
	Addresses []string `json:"addresses,omitempty"`
}

// RulePath is one path of a compiled rule, in order of preference.
type RulePath struct {
	// name of the path; always one of spec.paths on the same node.
	Name string `json:"name"`
	// weight is the path's share of subflow placements in this rule.
	Weight int32 `json:"weight"`
}

// CompiledRateLimits are a rule's rate limits, quantities in bits per second
// (burst in bytes).
type CompiledRateLimits struct {
	Mode RateMode `json:"mode"`
	// +optional
	PerConnection *resource.Quantity `json:"perConnection,omitempty"`
	// +optional
	PerPod *resource.Quantity `json:"perPod,omitempty"`
	// +optional
	PerNamespace *resource.Quantity `json:"perNamespace,omitempty"`
	// +optional
	// +listType=atomic
	PerPath []CompiledPathRate `json:"perPath,omitempty"`
	// direction police caps; unset: both.
	// +optional
	Direction RateDirection `json:"direction,omitempty"`
	// burst in bytes; unset: the datapath's default.
	// +optional
	Burst *resource.Quantity `json:"burst,omitempty"`
}

// CompiledPathRate caps a rule's traffic on one path.
type CompiledPathRate struct {
	Path string            `json:"path"`
	Rate resource.Quantity `json:"rate"`
}

// CompiledRule is one policy as it applies to some of the node's pods.
type CompiledRule struct {
	// name identifies the rule: its policy's name, and for a variant (a
	// tenant's preference applied) "@" and a hash of the preference
	// (internal/controller/compile.RuleName), e.g. "spread-fabrics" or
	// "spread-fabrics@3f9a1c2b7d". Pods refer to it. A changed policy
	// keeps its rules' names; the agent maps each name to a datapath id
	// that does not move while a live connection uses it, so a connection
	// always acts under its own policy's rule, as the policy is now.
	Name string `json:"name"`
	// policy is the MPTCPPolicy's name.
	Policy string `json:"policy"`
	// policyGeneration is the policy's metadata.generation compiled here;
	// the agent reports it back in status.appliedPolicies. Not part of
	// the name: a generation that compiles alike on this node keeps it.
	PolicyGeneration int64 `json:"policyGeneration"`
	// priority of the policy, for display: pods list their rules in order.
	// Not part of the name either.
	Priority int32 `json:"priority"`

	// traffic is the selector chain; unset matches all of the pod's traffic.
	// +optional
	Traffic *TrafficMatch `json:"traffic,omitempty"`

	// paths allowed, in order of preference, with weights. Paths of the
	// policy that do not exist on this node are left out (see status of the
	// policy, condition Degraded).
	// +optional
	// +listType=atomic
	Paths []RulePath `json:"paths,omitempty"`
	// spreadMode of placement over paths.
	SpreadMode SpreadMode `json:"spreadMode"`
	// backupPaths in order.
	// +optional
	// +listType=atomic
	BackupPaths []string `json:"backupPaths,omitempty"`
	// blockedPaths on which joins are refused.
	// +optional
	// +listType=atomic
	BlockedPaths []string `json:"blockedPaths,omitempty"`
	// maxSubflows per connection, the first included.
	MaxSubflows int32 `json:"maxSubflows"`
	// rateLimits, if any.
	// +optional
	RateLimits *CompiledRateLimits `json:"rateLimits,omitempty"`
	// subflowCreation is who creates extra subflows in the pod.
	SubflowCreation SubflowCreation `json:"subflowCreation"`
	// signalPorts announced in signal mode.
	// +optional
	// +listType=atomic
	SignalPorts []int32 `json:"signalPorts,omitempty"`
	// joinAfterBytes is how many bytes a connection carries before the
	// agent opens its joins (podMPTCP.joinAfterBytes, its default
	// applied); 0: at once.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1073741824
	JoinAfterBytes int64 `json:"joinAfterBytes,omitempty"`
	// dataChecksums keeps DSS checksums on in the pod (podMPTCP.dataChecksums).
	DataChecksums bool `json:"dataChecksums"`
	// congestionControl the agent sets in the pod's network namespace
	// (podMPTCP.congestionControl, its default applied); unset: the pod's
	// is left alone.
	// +optional
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:Pattern=`^[a-z0-9_]+$`
	CongestionControl string `json:"congestionControl,omitempty"`
	// headerRewriting is true only when the admin opted in.
	HeaderRewriting bool `json:"headerRewriting"`
	// preferredPaths are the paths the pod's mptcp.io/preferred-paths
	// annotation prefers, in its order: the first of paths, which they
	// lead. In every spread mode a connection's initial subflow takes the
	// first of them that is up; the mode decides only when none is.
	// +optional
	// +listType=atomic
	PreferredPaths []string `json:"preferredPaths,omitempty"`
}

// NodePod is a pod running on the node and the rules that govern it.
type NodePod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// ips of the pod (status.podIPs); empty until the pod has an address.
	// +optional
	// +listType=atomic
	IPs []string `json:"ips,omitempty"`
	// rules are names of spec.rules, in order of precedence (priority,
	// then policy name): for each connection the agent applies the first
	// rule whose traffic matches; at most 8.
	Rules RuleNames `json:"rules"`
	// transparent is the transparent MPTCP the pod has: inject when its
	// policy says inject and the pod carries the webhook's mark (which its
	// creator could set too: it only asks for the report below), kernel
	// when its policy says kernel (the agent's socket program makes the TCP
	// sockets created in its network namespace MPTCP); unset otherwise, and
	// for a pod that opted out. The agent reports on the pod's gate the
	// listeners of such a pod that still take TCP only.
	// +optional
	Transparent PodTransparency `json:"transparent,omitempty"`
}

// PodTransparency is the transparent MPTCP a node's pod has.
// +kubebuilder:validation:Enum=inject;kernel
type PodTransparency string

const (
	PodTransparencyInject PodTransparency = "inject"
	PodTransparencyKernel PodTransparency = "kernel"
)

// MPTCPNodeStateSpec is written by the controller only. It holds nothing
// about other nodes, so its size does not grow with the cluster.
type MPTCPNodeStateSpec struct {
	// podCIDRs of the node (node.spec.podCIDRs).
	// +optional
	// +listType=atomic
	PodCIDRs []string `json:"podCIDRs,omitempty"`
	// paths selected for this node, sorted by name.
	// +optional
	// +listType=atomic
	Paths []NodePath `json:"paths,omitempty"`
	// rules the node's pods refer to, each once, sorted by name: the
	// spec grows with the pods and the distinct rules, not with their
	// product.
	// +optional
	// +listType=atomic
	Rules []CompiledRule `json:"rules,omitempty"`
	// pods on this node governed by at least one policy, sorted by
	// namespace/name.
	// +optional
	// +listType=atomic
	Pods []NodePod `json:"pods,omitempty"`
}

// RuleNames are a pod's rules by name. A node state written by a release
// before rules were listed once per node state (chart 0.1.0) has each
// pod's compiled rules inline instead: they decode as the one name
// OutdatedRule, so that what lists node states during an upgrade (the
// controller's and the agents' caches) keeps working, and Outdated tells
// the spec apart: the agent enforces none of it and the controller
// rewrites it. Only this list is lenient; every other field decodes as
// strictly as its decoder asks. The list's markers are the type's:
// controller-gen leaves a field's off a type that decodes itself.
// +listType=atomic
// +kubebuilder:validation:MaxItems=8
type RuleNames []string

// OutdatedRule stands for the inline rules of an earlier release's pod; no
// rule has an empty name.
const OutdatedRule = ""

// UnmarshalJSON decodes names, or an earlier release's inline rules as
// OutdatedRule.
func (r *RuleNames) UnmarshalJSON(b []byte) error {
	var names []string
	err := json.Unmarshal(b, &names)
	if err == nil {
		*r = names
		return nil
	}
	var inline []map[string]json.RawMessage
	if json.Unmarshal(b, &inline) != nil || len(inline) == 0 {
		return err
	}
	*r = RuleNames{OutdatedRule}
	return nil
}

// Outdated says the spec was written by an earlier release (RuleNames).
func (s *MPTCPNodeStateSpec) Outdated() bool {
	for _, p := range s.Pods {
		if slices.Contains(p.Rules, OutdatedRule) {
			return true
		}
	}
	return false
}

// LinkState is the carrier state of a path's interface on this node.
// +kubebuilder:validation:Enum=Up;Down;NotFound;Ambiguous
type LinkState string

const (
	LinkUp        LinkState = "Up"
	LinkDown      LinkState = "Down"
	LinkNotFound  LinkState = "NotFound"
	LinkAmbiguous LinkState = "Ambiguous"
)

// Liveness is what probes to peers over a path say.
// +kubebuilder:validation:Enum=Alive;Failing;Unknown
type Liveness string

const (
	LivenessAlive   Liveness = "Alive"
	LivenessFailing Liveness = "Failing"
	LivenessUnknown Liveness = "Unknown"
)

// PathState is the agent's view of one of the node's paths.
type PathState struct {
	// name of one of spec.paths; the controller ignores a path state
	// under any other name.
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// interface is the kernel name of the interface found, if any.
	// +optional
	Interface string    `json:"interface,omitempty"`
	Link      LinkState `json:"link"`
	// liveness is what probes to the peers over the path say: Alive
	// (every peer that ever echoed echoes), Failing (one stopped while it
	// still answered on another path) or Unknown (no peer, none echoed
	// yet, each silent on every path at once, or liveness off). A path
	// all of whose peers stopped is down like a NIC without carrier.
	// +optional
	Liveness Liveness `json:"liveness,omitempty"`
	// addresses of the node on this path, as the agent found them on the
	// path's interface.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4
	Addresses []string `json:"addresses,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
}

// AppliedPolicy is a policy generation the agent enforces.
type AppliedPolicy struct {
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
}

// AttachedProgram is one of the datapath's programs and the interfaces it is
// attached to on the node.
type AttachedProgram struct {
	// hook names the program and where it runs: pod-egress and pod-ingress
	// on pods' host-side interfaces, nic-ingress and nic-egress on path
	// interfaces (docs/datapath.md).
	Hook string `json:"hook"`
	// interfaces it is attached to, sorted.
	// +optional
	// +listType=atomic
	Interfaces []string `json:"interfaces,omitempty"`
}

// PodProblemReason says why the agent skipped a pod.
// +kubebuilder:validation:Enum=TooManyRules;RuleUnusable;RuleMissing;RuleTableFull;InvalidAddress;NotFound;AddressOnPath;ConfigureFailed
type PodProblemReason string

const (
	// PodTooManyRules: the pod has more rules than its selector chain
	// holds (MaxPodPolicies).
	PodTooManyRules PodProblemReason = "TooManyRules"
	// PodRuleUnusable: one of the pod's rules cannot be enforced on this
	// node (none of its paths is usable here, a value the datapath
	// refuses).
	PodRuleUnusable PodProblemReason = "RuleUnusable"
	// PodRuleMissing: the pod names a rule the spec does not hold.
	PodRuleMissing PodProblemReason = "RuleMissing"
	// PodRuleTableFull: the node's other pods hold every rule the
	// datapath's table has room for (MaxNodeRules).
	PodRuleTableFull PodProblemReason = "RuleTableFull"
	// PodInvalidAddress: one of the pod's ips is not an address.
	PodInvalidAddress PodProblemReason = "InvalidAddress"
	// PodNotFound: the pod's address leads to no local pod.
	PodNotFound PodProblemReason = "NotFound"
	// PodAddressOnPath: the pod's address leads out of a path's NIC.
	PodAddressOnPath PodProblemReason = "AddressOnPath"
	// PodConfigureFailed: the agent could not configure the pod (its
	// namespace vanished, its MPTCP settings, path manager or datapath
	// entries could not be set); it is tried again at the next reconcile.
	PodConfigureFailed PodProblemReason = "ConfigureFailed"
)

// MaxPodProblems bounds status.pods: the tenants of one node cannot make
// its status grow with their pods; status.skippedPods counts them all.
const MaxPodProblems = 32

// MaxPodProblemsPerNamespace bounds the entries of one namespace in
// status.pods: a tenant with many skipped pods cannot push the other
// tenants' out of it (nor out of the controller's events, made from it).
const MaxPodProblemsPerNamespace = 4

// MaxNodeRules is how many distinct rules one node enforces at once (the
// datapath's rule table).
const MaxNodeRules = limits.Rules

// PodProblem is a governed pod the agent skipped: it is not configured
// (its gate stays False), the node's other pods are.
type PodProblem struct {
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// +kubebuilder:validation:MaxLength=253
	Name   string           `json:"name"`
	Reason PodProblemReason `json:"reason"`
	// message says what is wrong and what to change.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// PodCongestionControl is a congestion control the agent set in pods.
type PodCongestionControl struct {
	// +kubebuilder:validation:MaxLength=15
	Name string `json:"name"`
	// pods configured with it.
	// +kubebuilder:validation:Minimum=0
	Pods int32 `json:"pods"`
}

// CheckResult is the outcome of one of the agent's checks of its node.
// +kubebuilder:validation:Enum=Passed;Warning;Failed
type CheckResult string

const (
	CheckPassed CheckResult = "Passed"
	// CheckWarning: the node works, in a way the project has not proven
	// (an untested CNI) or with a feature off.
	CheckWarning CheckResult = "Warning"
	// CheckFailed: something the product needs is missing or clashes;
	// docs/troubleshooting.md has an entry per reason.
	CheckFailed CheckResult = "Failed"
)

// NodeCheck is one of the agent's checks of its node (kubectl mptcp
// preflight): the kernel, BTF, bpffs, the CNI and its marks, the node's
// pod CIDRs.
type NodeCheck struct {
	// name of the check: Kernel, BTF, BPFFS, CNI, Marks or PodCIDRs.
	// +kubebuilder:validation:MaxLength=32
	Name   string      `json:"name"`
	Result CheckResult `json:"result"`
	// reason names what failed (MarkClash, NoPodCIDRs, ...), the anchor
	// of its entry in docs/troubleshooting.md.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`
	// message says what was found and what to change.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// MPTCPNodeStateStatus is written by the node's agent only.
type MPTCPNodeStateStatus struct {
	// observedGeneration is the spec generation the agent last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// paths: link and liveness per path of spec.paths, which has at most
	// 15 (the path indexes).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=15
	Paths []PathState `json:"paths,omitempty"`
	// appliedPolicies: the generation of each policy in force on the node.
	// +optional
	// +listType=map
	// +listMapKey=name
	AppliedPolicies []AppliedPolicy `json:"appliedPolicies,omitempty"`
	// attached: the datapath's programs and the interfaces they are
	// attached to, as the agent found them after its last reconcile.
	// +optional
	// +listType=map
	// +listMapKey=hook
	Attached []AttachedProgram `json:"attached,omitempty"`
	// errors that kept part of the spec from being applied (the agent keeps
	// the last good state meanwhile).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Errors []string `json:"errors,omitempty"`
	// pods the agent skipped, each for a problem of its own, sorted by
	// namespace and name; the node's other pods are enforced. At most
	// 32 (MaxPodProblems) are listed, at most 4 of one namespace
	// (MaxPodProblemsPerNamespace), so that one tenant's pods cannot hide
	// the others'; skippedPods counts them all.
	// +optional
	// +listType=map
	// +listMapKey=namespace
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	Pods []PodProblem `json:"pods,omitempty"`
	// skippedPods counts the pods skipped, listed in pods or not.
	// +optional
	// +kubebuilder:validation:Minimum=0
	SkippedPods int32 `json:"skippedPods,omitempty"`
	// congestionControls: the TCP congestion controls the agent set in the
	// node's configured pods, each with how many pods run it.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	CongestionControls []PodCongestionControl `json:"congestionControls,omitempty"`
	// checks: the agent's checks of its node, made when it starts (the
	// pod CIDRs' at every reconcile); kubectl mptcp preflight shows them.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Checks []NodeCheck `json:"checks,omitempty"`
	// conditions: Ready, Progressing, Degraded, NodeSupported (whether
	// every check passed: False with the first failed check's reason).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MPTCPNodeState is the compiled, node-local result for one node; its name is
// the node's name. The controller writes spec, the node's agent writes status.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=mnode,categories=mptcp
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Degraded",type=string,JSONPath=`.status.conditions[?(@.type=="Degraded")].status`
// +kubebuilder:printcolumn:name="Generation",type=integer,JSONPath=`.metadata.generation`,priority=1
// +kubebuilder:printcolumn:name="Observed",type=integer,JSONPath=`.status.observedGeneration`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MPTCPNodeState struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec MPTCPNodeStateSpec `json:"spec,omitempty"`
	// +optional
	Status MPTCPNodeStateStatus `json:"status,omitempty"`
}

// MPTCPNodeStateList is a list of MPTCPNodeState.
//
// +kubebuilder:object:root=true
type MPTCPNodeStateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MPTCPNodeState `json:"items"`
}

// Rule returns the rule of s named name, or nil.
func (s *MPTCPNodeStateSpec) Rule(name string) *CompiledRule {
	for i := range s.Rules {
		if s.Rules[i].Name == name {
			return &s.Rules[i]
		}
	}
	return nil
}
