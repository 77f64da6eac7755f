// Package limits holds the datapath's limits, defined once in C (enum limit,
// bpf/include/common.h) and exported here by bpf2go, so that the datapath,
// the agent, the controller and the API's schema all check the same numbers.
// The API's markers and CEL rules must be literals: a test in api/v1alpha1
// checks that the generated CRDs say what this package says.
package limits

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type limit limits ../../../bpf/limits.c -- -I../../../bpf/include -I/usr/include/x86_64-linux-gnu

const (
	// Paths is how many paths a node steers over. A path's index, 1..Paths,
	// is the value its packets' mark holds and the offset of its routing
	// table; 0 means "not steered".
	Paths = int(limitsLimitLIMIT_PATHS)
	// Rules is how many rules a node's datapath holds at once (ids
	// 0..Rules-1): the node state's distinct rules, and those retired
	// ones that live connections still use.
	Rules = int(limitsLimitLIMIT_RULES)
	// PodRules is how many rules one pod's selector chain holds.
	PodRules = int(limitsLimitLIMIT_POD_RULES)
	// RulePorts is how many port ranges one rule selects.
	RulePorts = int(limitsLimitLIMIT_RULE_PORTS)
	// RuleCIDRs is how many remote CIDRs one rule selects.
	RuleCIDRs = int(limitsLimitLIMIT_RULE_CIDRS)
	// Subflows is how many subflows a connection has at most, the first
	// included: the kernel's own cap.
	Subflows = int(limitsLimitLIMIT_SUBFLOWS)
	// Weight is the largest weight of a path in a rule.
	Weight = int(limitsLimitLIMIT_WEIGHT)
	// Pods is how many pod addresses one node's datapath selects.
	Pods = int(limitsLimitLIMIT_PODS)
	// PodSubflows is how many entries of the node's subflow table one pod
	// holds at most: its subflows beyond take plain routing.
	PodSubflows = int(limitsLimitLIMIT_POD_SUBFLOWS)
	// MinBurstBytes and MaxBurstBytes bound a rate bucket's depth (police)
	// and the window granted at once (window).
	MinBurstBytes = int(limitsLimitLIMIT_BURST_MIN_BYTES)
	MaxBurstBytes = int(limitsLimitLIMIT_BURST_MAX_BYTES)
)
