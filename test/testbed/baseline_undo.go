package testbed

import (
	"context"
	"fmt"
	"strconv"
)

// RemoveHandRoute removes what HandRoute installed, so that a later scenario
// on the same bed starts from plain routing.
func (b *Bed) RemoveHandRoute() error {
	ctx := context.Background()
	for _, n := range b.Nodes {
		cmds := []string{"rule del pref 1000"}
		for _, c := range n.NICs[1:] {
			cmds = append(cmds,
				fmt.Sprintf("rule del pref %d", 1000+2*c.Index),
				fmt.Sprintf("rule del pref %d", 1001+2*c.Index),
				"route flush table "+strconv.Itoa(100+c.Index),
			)
		}
		if err := ipBatch(ctx, n.NetNS, cmds...); err != nil {
			return err
		}
	}
	b.mu.Lock()
	b.handRoute = false
	b.mu.Unlock()
	return nil
}
