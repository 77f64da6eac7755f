package framework

import (
	"path/filepath"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// NodeName is the Kubernetes name of a bed node: its namespace's name.
func NodeName(n *testbed.Node) string { return filepath.Base(n.NetNS) }
