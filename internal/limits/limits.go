// Package limits holds the datapath's limits for Go: the datapath, the agent,
// the controller and the API's schema all check these numbers, so the API
// never accepts what an agent must refuse.
//
// C has its own definition, enum limit in bpf/include/common.h, which the
// programs and their maps are sized by. Each language defines them once, and
// a test in internal/datapath reads the enum from the compiled object's BTF
// and checks that every value equals the constant here. The package imports
// nothing, so that the API types (and the controller) build without the
// datapath's eBPF library and on every architecture. The API's markers and
// CEL rules must be literals: a test in api/v1alpha1 checks that the
// generated CRDs say what this package says.
package limits

const (
	// Paths is how many paths a node steers over (LIMIT_PATHS). A path's
	// index, 1..Paths, is the value its packets' mark holds and the offset
	// of its routing table; 0 means "not steered".
	Paths = 15
	// Rules is how many rules a node's datapath holds at once (ids
	// 0..Rules-1; LIMIT_RULES): the node state's distinct rules, and those
	// retired ones that live connections still use.
	Rules = 256
	// PodRules is how many rules one pod's selector chain holds
	// (LIMIT_POD_RULES).
	PodRules = 8
	// RulePorts is how many port ranges one rule selects
	// (LIMIT_RULE_PORTS).
	RulePorts = 8
	// RuleCIDRs is how many remote CIDRs one rule selects
	// (LIMIT_RULE_CIDRS).
	RuleCIDRs = 32
	// Subflows is how many subflows a connection has at most, the first
	// included (LIMIT_SUBFLOWS): the kernel's own cap.
	Subflows = 8
	// Weight is the largest weight of a path in a rule (LIMIT_WEIGHT).
	Weight = 255
	// Pods is how many pod addresses one node's datapath selects
	// (LIMIT_PODS).
	Pods = 4096
	// PodSubflows is how many entries of the node's subflow table one pod
	// holds at most (LIMIT_POD_SUBFLOWS): its subflows beyond take plain
	// routing.
	PodSubflows = 4096
	// PodArrivals is how many SYNs from the wire one pod has waiting for
	// its answer (LIMIT_POD_ARRIVALS): each pod stages in a map of its
	// own, so a flood at one pod evicts only that pod's.
	PodArrivals = 512
	// PodAnswered and PodAnsweredJoins are how many initial subflows and
	// joins one pod answered wait for their third ACK at once
	// (LIMIT_POD_ANSWERED, LIMIT_POD_ANSWERED_JOINS), each in a map of the
	// pod's own.
	PodAnswered      = 512
	PodAnsweredJoins = 256
	// ProbedPeers is how many peers a node's liveness probes at most
	// (LIMIT_PROBED_PEERS, the slots of the datapath's traffic times): the
	// datapath's maps below are sized for them.
	ProbedPeers = 1000
	// LivenessPairs is how many pairs of a node's path address and a
	// peer's address on that path the datapath lets send to the liveness
	// port (LIMIT_LIVENESS_PAIRS): 15 paths of 1000 peers of 4 addresses,
	// and the node's own 15.
	LivenessPairs = 65536
	// PeerCIDRs is how many pod CIDRs of peers the datapath holds paths
	// down for (LIMIT_PEER_CIDRS): 1000 peers of two (one per family).
	PeerCIDRs = 2048
	// TunnelHops is how many entries the datapath holds to readdress an
	// overlay's outer packets (LIMIT_TUNNEL_HOPS): for each address a peer
	// has on a path, the peer's address on each other path and the node's
	// own on the address's path; 1000 peers of one address on each of 15
	// paths, 15 x 15 entries each.
	TunnelHops = 262144
	// MinBurstBytes and MaxBurstBytes bound a rate bucket's depth (police)
	// and the window granted at once (window): LIMIT_BURST_MIN_BYTES and
	// LIMIT_BURST_MAX_BYTES.
	MinBurstBytes = 64 << 10
	MaxBurstBytes = 1 << 30
)
