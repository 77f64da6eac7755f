// Package controller wires the mptcp.io controllers into a manager: nodestate
// compiles each node's MPTCPNodeState, path assigns path indexes and reports
// path health, policystatus aggregates per-policy status from node states.
package controller
