// Package v1alpha1 holds the mptcp.io/v1alpha1 API: MPTCPPath (which NICs form
// a path), MPTCPPolicy (which pods and traffic get which multipath treatment),
// MPTCPNodeState (the per-node result the controller compiles and the agent
// enforces) and MPTCPPeer (a node as the other nodes' agents probe it).
//
// +kubebuilder:object:generate=true
// +groupName=mptcp.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "mptcp.io", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds of this package with a scheme. The
	// package depends on apimachinery only, so that agents and tools can
	// import it cheaply.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the kinds of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&MPTCPPath{}, &MPTCPPathList{},
		&MPTCPPolicy{}, &MPTCPPolicyList{},
		&MPTCPNodeState{}, &MPTCPNodeStateList{},
		&MPTCPPeer{}, &MPTCPPeerList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
