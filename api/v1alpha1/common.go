package v1alpha1

// Condition types shared by every kind in this API. They follow the usual
// Kubernetes meaning: Ready means the desired state is in force, Progressing
// that it is still being reached, Degraded that some of it cannot be.
const (
	ConditionReady       = "Ready"
	ConditionProgressing = "Progressing"
	ConditionDegraded    = "Degraded"
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

	// AnnotationNodePaths is written by the controller on each Node: the
	// node's pod CIDRs and its address on every path, as reported by that
	// node's agent (see PeerInfo). Agents learn their peers by watching Node
	// metadata, so no MPTCPNodeState grows with the size of the cluster.
	AnnotationNodePaths = "mptcp.io/paths"
)

// MaxPathIndex bounds the index the controller assigns to each path. Agents
// encode it in a packet mark under a configurable mask, so it must stay small.
const MaxPathIndex = 63
