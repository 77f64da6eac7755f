package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MPTCPPeerSpec is a node as the other nodes' agents see it: where its
// pods live and its addresses on each path.
type MPTCPPeerSpec struct {
	// podCIDRs of the node (its node.spec.podCIDRs, one per family) that
	// overlap no other node's: a path whose probes the node stops
	// answering carries nothing to these addresses, even while other
	// nodes keep it up.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=2
	PodCIDRs []string `json:"podCIDRs,omitempty"`
	// paths of the node, by name, sorted, each with the node's addresses
	// on it as its agent reports them, less any address another node
	// has: what the other nodes' agents probe each path's liveness to
	// (docs/agent.md, "Liveness").
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=15
	Paths []PeerPath `json:"paths"`
}

// PeerPath is a node's addresses on one path.
type PeerPath struct {
	Name string `json:"name"`
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4
	Addresses []string `json:"addresses"`
}

// MPTCPPeer is one node with pods under a policy, as its peers probe and
// reach it; its name is the node's name. The controller writes it, one per
// such node with an address on a path, and every agent watches them all:
// a node's new address is one write, whatever the size of the cluster.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=mpeer,categories=mptcp
// +kubebuilder:printcolumn:name="Paths",type=string,JSONPath=`.spec.paths[*].name`
// +kubebuilder:printcolumn:name="Pod CIDRs",type=string,JSONPath=`.spec.podCIDRs`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MPTCPPeer struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec MPTCPPeerSpec `json:"spec"`
}

// MPTCPPeerList is a list of MPTCPPeer.
//
// +kubebuilder:object:root=true
type MPTCPPeerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MPTCPPeer `json:"items"`
}
