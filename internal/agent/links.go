package agent

import (
	"github.com/mptcp-operator/mptcp-operator/internal/agent/linkwatch"
)

// nicInForce is a path NIC as the last reconcile found it.
type nicInForce struct {
	index int
	paths []uint32
	down  bool
}

// LinkChanged applies a path NIC's carrier change to the datapath at once,
// between reconciles: its paths go down when the NIC loses its carrier or
// goes away (new subflows avoid them, existing ones detour over another
// path of their rule: bpf/include/detour.h), and up again when it comes
// back under the index the last reconcile programmed. A NIC that came back
// under another index (deleted and created again) stays down until the
// next reconcile has programmed it. It returns whether the NIC of a path in
// force is no longer as the last reconcile found it: the caller then
// reconciles soon, which also reports the link in status.
func (a *Agent) LinkChanged(c linkwatch.Change) bool {
	n, ok := (*a.nics.Load())[c.Name]
	if !ok {
		return false
	}
	// The name now belongs to a link the last reconcile did not program
	// (index 0: it found none).
	other := !c.Gone && c.Index != n.index
	down := c.Gone || !c.Running || other
	for _, p := range n.paths {
		if err := a.dp.SetPathDown(p, down); err != nil {
			a.log.Error("link event: marking the path", "interface", c.Name, "path", p, "down", down, "err", err)
		}
	}
	if down == n.down && !other {
		return false
	}
	a.log.Info("path link changed", "interface", c.Name, "paths", n.paths, "running", c.Running, "gone", c.Gone, "down", down)
	return true
}
