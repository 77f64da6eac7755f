package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// InterfaceSelector names the interface that carries a path on each selected
// node. Exactly one way of naming it is allowed, so an agent never has to
// guess which one wins: the rule is on MPTCPPathSpec's field, so that the
// node state, which copies the selector, carries no CEL of it.
type InterfaceSelector struct {
	// name is the exact kernel interface name, e.g. "nic1" or "bond0".
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:Pattern=`^[^/\s:]+$`
	Name string `json:"name,omitempty"`

	// pattern is a shell glob matched against interface names, e.g. "ens*f1".
	// When several interfaces match, the agent reports the path Degraded
	// rather than pick one.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	Pattern string `json:"pattern,omitempty"`

	// altName is an alternative interface name (ip link property add altname),
	// which lets an admin give the same name to NICs that the kernel names
	// differently on different hardware.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=127
	// +kubebuilder:validation:Pattern=`^[^/\s:]+$`
	AltName string `json:"altName,omitempty"`
}

// MPTCPPathSpec describes a path class: an interface on a set of nodes.
type MPTCPPathSpec struct {
	// nodeSelector selects the nodes that have this path. Empty selects
	// every node.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// interface names the interface that carries the path on each node.
	// +required
	// +kubebuilder:validation:XValidation:rule="[has(self.name), has(self.pattern), has(self.altName)].filter(x, x).size() == 1",message="exactly one of name, pattern or altName must be set"
	Interface InterfaceSelector `json:"interface"`

	// capacity is the path's rate in bits per second, e.g. "10G". It
	// bounds every cap on the path: a policy's perPath rate above it
	// caps at the capacity, and shaping on the path's NIC (HTB) never
	// lets more than the capacity through its classes together.
	// +required
	// +kubebuilder:validation:XValidation:rule="!string(self).endsWith('i')",message="capacity is in bits per second: write a decimal SI quantity (e.g. 5G, 100M), not a binary one (5Gi, 100Mi)"
	// +kubebuilder:validation:XValidation:rule="quantity(self).isInteger() && quantity(self).isGreaterThan(quantity('0'))",message="capacity must be a positive whole number of bits per second, e.g. 10G"
	Capacity resource.Quantity `json:"capacity"`

	// defaultRole is the path's role in the policies that list it in
	// spread.paths without a role of their own: backup makes it one of
	// their backup paths (its subflows flagged backup), in those that
	// allow header rewriting.
	// +optional
	// +kubebuilder:default=active
	DefaultRole PathRole `json:"defaultRole,omitempty"`

	// weight is the path's share of subflow placements when a policy lists it
	// without a weight of its own. Weights count subflows, not bytes: the host
	// places subflows, the guest's scheduler decides bytes.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=255
	Weight int32 `json:"weight,omitempty"`

	// sharedRiskGroup names what the path shares with others: an uplink,
	// a switch, a provider, a bottleneck or a failure. Paths with the same
	// group share it. A connection's joins go to paths of groups its
	// subflows do not use yet first, and to a path that shares a group
	// only when no other path is free. Unset, the path shares nothing.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	SharedRiskGroup string `json:"sharedRiskGroup,omitempty"`
}

// MPTCPPathStatus is written by the controller.
type MPTCPPathStatus struct {
	// index is a small integer assigned by the controller, unique among paths
	// and stable for the life of the path, so that every agent encodes this
	// path with the same packet mark: the index is the mark's value and the
	// offset of the path's routing table on every node. Zero means not
	// assigned yet (all 15 in use).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=15
	Index int32 `json:"index,omitempty"`

	// nodes is how many nodes the nodeSelector selects.
	// +optional
	Nodes int32 `json:"nodes,omitempty"`

	// nodesWithoutInterface lists (up to 16, sorted) nodes whose agent found
	// no interface matching this path.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	NodesWithoutInterface []string `json:"nodesWithoutInterface,omitempty"`

	// observedGeneration is the generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Ready (an index is assigned and every selected node has
	// the interface) and Degraded (some nodes lack it).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MPTCPPath is a named path class ("fabric-a", "lte-backup"): which interface
// on which nodes. Like a StorageClass it is infrastructure, referenced by name
// from policies.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && self.metadata.name.size() <= 63",message="metadata.name of a path must be a DNS label (policies and pod annotations list paths by name)"
// +kubebuilder:resource:scope=Cluster,shortName=mpath,categories=mptcp
// +kubebuilder:printcolumn:name="Interface",type=string,JSONPath=`.spec.interface.name`
// +kubebuilder:printcolumn:name="Pattern",type=string,JSONPath=`.spec.interface.pattern`,priority=1
// +kubebuilder:printcolumn:name="Role",type=string,JSONPath=`.spec.defaultRole`
// +kubebuilder:printcolumn:name="Capacity",type=string,JSONPath=`.spec.capacity`
// +kubebuilder:printcolumn:name="Index",type=integer,JSONPath=`.status.index`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MPTCPPath struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec MPTCPPathSpec `json:"spec"`
	// +optional
	Status MPTCPPathStatus `json:"status,omitempty"`
}

// MPTCPPathList is a list of MPTCPPath.
//
// +kubebuilder:object:root=true
type MPTCPPathList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MPTCPPath `json:"items"`
}
