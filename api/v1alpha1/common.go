package v1alpha1

import "github.com/mptcp-operator/mptcp-operator/internal/limits"

// Condition types shared by every kind in this API. They follow the usual
// Kubernetes meaning: Ready means the desired state is in force, Progressing
// that it is still being reached, Degraded that some of it cannot be.
const (
	ConditionReady       = "Ready"
	ConditionProgressing = "Progressing"
	ConditionDegraded    = "Degraded"
)

// ConditionTransparentKernel, on an MPTCPNodeState, says what became of
// podMPTCP.transparent kernel on the node: True (Attached) while the
// socket program covers the pods that have it, False (Unsupported) with
// the kernel's reason where it refuses the program; absent while no pod of
// the node has it. A policy whose pods are on such a node is Degraded for
// the same reason.
const (
	ConditionTransparentKernel = "TransparentKernel"
	ReasonUnsupported          = "Unsupported"
)

// ConditionNodeSupported, on an MPTCPNodeState, sums up status.checks:
// True when none failed (reason Passed, or Warnings when some warn), False
// with the reason of the first that failed. An agent that finds its marks
// clash with the CNI's enforces nothing (reason MarkClash).
const (
	ConditionNodeSupported = "NodeSupported"
	ReasonChecksPassed     = "Passed"
	ReasonChecksWarned     = "Warnings"
	ReasonMarkClash        = "MarkClash"
	ReasonNoPodCIDRs       = "NoPodCIDRs"
)

// Reasons of an MPTCPNodeState's Degraded condition besides MarkClash: what
// keeps the agent from enforcing the spec, whole or in part.
const (
	ReasonInvalidSpec      = "InvalidSpec"
	ReasonInterfaceMissing = "InterfaceMissing"
	ReasonApplyFailed      = "ApplyFailed"
	// ReasonCapsNotEnforced: the node is enforced, but some rules' caps
	// miss part of their traffic on this node's CNI (an overlay).
	ReasonCapsNotEnforced = "CapsNotEnforced"
)

// PathRole says whether a path carries subflows from the start (active) or only
// when no active path is alive (backup, the MP_JOIN/MP_PRIO B bit).
// +kubebuilder:validation:Enum=active;backup
type PathRole string

const (
	PathRoleActive PathRole = "active"
	PathRoleBackup PathRole = "backup"
)

// Annotations and labels owned by this API.
const (
	// AnnotationPreferredPaths is set by a tenant on a pod: a comma-separated,
	// ordered list of path names the pod prefers, e.g. "fabric-b,fabric-a".
	// It is honoured only when the pod's policy allows tenant preferences and
	// every name is one of the policy's spread paths; otherwise the controller
	// records a Warning event on the pod and changes nothing.
	AnnotationPreferredPaths = "mptcp.io/preferred-paths"
	// PodReadyCondition is the condition the node's agent sets on each pod
	// a policy selects (the pod gate): True once the pod is configured,
	// False with the reason while it is not.
	PodReadyCondition = "mptcp.io/ready"
)

// Limits of the API. Each is the datapath's own (package limits, which a
// datapath test checks against enum limit in bpf/include/common.h), so the
// API never accepts what an agent must refuse. The schema's markers and CEL
// rules must state them as literals; TestSchemaLimitsAreTheDatapaths checks
// that the generated CRDs say the same numbers as these constants.
const (
	// MaxPathIndex bounds the index the controller assigns to each path:
	// indexes 1..MaxPathIndex are the values a packet's mark carries.
	MaxPathIndex = limits.Paths
	// MaxPolicyPaths bounds the paths one policy spreads over and keeps as
	// backups, together: a rule's path list in the datapath.
	MaxPolicyPaths = limits.Paths
	// MaxPortRanges and MaxCIDRs bound a policy's traffic selector.
	MaxPortRanges = limits.RulePorts
	MaxCIDRs      = limits.RuleCIDRs
	// MaxSubflows bounds maxSubflows: the kernel's own cap.
	MaxSubflows = limits.Subflows
	// MaxSignalPorts is one port per extra subflow.
	MaxSignalPorts = limits.Subflows - 1
	// MaxWeight bounds a path's weight.
	MaxWeight = limits.Weight
	// MaxPodPolicies bounds the policies applied to one pod: its selector
	// chain in the datapath.
	MaxPodPolicies = limits.PodRules
	// MinBurstBytes and MaxBurstBytes bound rateLimits.burst.
	MinBurstBytes = limits.MinBurstBytes
	MaxBurstBytes = limits.MaxBurstBytes
)

// A connection's join threshold (podMPTCP.joinAfterBytes): the agent, not the
// datapath, holds it, so its bound is the API's own, checked by the schema
// and again by the agent.
const (
	// MaxJoinAfterBytes bounds podMPTCP.joinAfterBytes: past a gibibyte
	// a connection has long shown it is no small flow.
	MaxJoinAfterBytes = 1 << 30
	// DefaultJoinAfterBytes is the threshold of a userspace-mode policy
	// that sets none, chosen from the measurement in docs/subflows.md
	// ("Small flows").
	DefaultJoinAfterBytes = 128 << 10
)

// A pod's TCP congestion control (podMPTCP.congestionControl).
const (
	// DefaultCongestionControl is the one a policy that names none sets:
	// cubic, whose subflows do not pause together as bbr's do
	// (docs/benchmarks.md, "Steady state: longest stall").
	DefaultCongestionControl = "cubic"
	// MaxCongestionControlName is the kernel's longest name
	// (TCP_CA_NAME_MAX, its terminating NUL left out).
	MaxCongestionControlName = 15
)
