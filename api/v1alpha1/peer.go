package v1alpha1

// PeerInfo is the value of the Node annotation mptcp.io/paths, as JSON: what a
// peer agent needs to reach this node's pods over each path. The controller
// writes it from the node's MPTCPNodeState status (which only that node's
// agent writes), once per change, so publishing costs O(nodes) writes and no
// node state holds anything about other nodes. Agents read it by watching
// Node metadata.
type PeerInfo struct {
	// PodCIDRs of the node.
	PodCIDRs []string `json:"podCIDRs,omitempty"`
	// Paths maps a path name to the node's addresses on that path.
	Paths map[string][]string `json:"paths"`
}
