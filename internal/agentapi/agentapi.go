// Package agentapi holds what the agent's local API answers, as JSON: the
// contract between the agent (internal/agent/observe serves it) and its
// readers (kubectl mptcp, the tests), kept apart so that a reader does not
// link the agent.
package agentapi

import "time"

// Socket is the local API's unix socket's name under the agent's state
// directory.
const Socket = "agent.sock"

// SubflowInfo is one subflow as the local API reports it.
type SubflowInfo struct {
	Local  string `json:"local"`
	Remote string `json:"remote"`
	// Path is the path's name (empty when no path has that index any
	// more), PathIndex its index.
	Path      string `json:"path"`
	PathIndex uint32 `json:"pathIndex"`
	// Detour is the name of the path the subflow travels instead while
	// its own is down on one of the two nodes; empty when it travels its
	// own (docs/agent.md, "Failover").
	Detour string `json:"detour,omitempty"`
	// Role is "initiator" (a local pod opened it, this node chose the
	// path) or "responder" (mirrored from the NIC it arrived on).
	Role string `json:"role"`
	// Token is the MP_JOIN token (the receiver's), "" for an initial subflow.
	Token string `json:"token,omitempty"`
	// Connection is its connection's token (ConnectionInfo.Token), "" until
	// the datapath knows it.
	Connection string    `json:"connection,omitempty"`
	Rule       string    `json:"rule"`
	RuleIndex  uint32    `json:"ruleIndex"`
	Created    time.Time `json:"created"`
	// TxBytes and RxBytes are what the local pod sent and received on it.
	TxBytes uint64 `json:"txBytes"`
	RxBytes uint64 `json:"rxBytes"`
}

// ConnectionInfo is one connection as the local API reports it.
type ConnectionInfo struct {
	Local string `json:"local"`
	// Token is the responder's token, the connection's key on both nodes.
	Token string `json:"token"`
	// Paths are the names of the paths its subflows use.
	Paths []string `json:"paths"`
	// Joins counts the joins this node placed.
	Joins uint32 `json:"joins"`
	// TxBytes and RxBytes are what the local pod sent and received on the
	// connection, summed over its subflows still in the subflow table.
	// They are served here and not as metrics, which would have to name the
	// connection by its token (metrics_record.go).
	TxBytes uint64 `json:"txBytes"`
	RxBytes uint64 `json:"rxBytes"`
}

// PodReport is what the agent knows of one pod's MPTCP: what `kubectl mptcp
// explain` and `subflows` read (through the API server, by running the
// agent binary in the agent's container: LocalAPIGet).
type PodReport struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Configured says the agent configures the pod (it is in the node
	// state and not skipped); the rest is empty when it does not.
	Configured bool `json:"configured"`
	// Connections are the pod's MPTCP connections in the datapath's tables,
	// each with its subflows.
	Connections []PodConnection `json:"connections"`
	// Counters are the MPTcpExt counters of the pod's network namespace
	// (/proc/net/netstat): fallbacks, checksum errors, resets, joins.
	Counters      map[string]uint64 `json:"counters,omitempty"`
	CountersError string            `json:"countersError,omitempty"`
	// PathManager is the agent's userspace path manager of the pod; nil
	// when the pod's joins are not the agent's to open (signal, guest).
	PathManager *PathManagerInfo `json:"pathManager,omitempty"`
	// NodeJoinsRefused counts the peers' joins the node's datapath refused
	// (a rule's blocked path or its maxSubflows), for every pod of the node:
	// the datapath does not count them per pod.
	NodeJoinsRefused uint64 `json:"nodeJoinsRefused"`
}

// PodConnection is a connection with its subflows.
type PodConnection struct {
	ConnectionInfo
	Subflows []SubflowInfo `json:"subflows"`
}

// PathManagerInfo is the state of a pod's userspace path manager.
type PathManagerInfo struct {
	Up       bool   `json:"up"`
	Restarts uint64 `json:"restarts"`
}
