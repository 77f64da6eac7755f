package agent

import (
	"errors"
	"fmt"
	"testing"
)

// A pending map migration is committed by a reconcile that enforces and
// rolled back by one that fails; one refused for a mark clash (alone, or
// with what stopping for it failed to do) leaves it pending: the old
// programs put back would mark the CNI's bits, and the restarted agent
// would meet the clash again.
func TestAMarkClashLeavesAMapMigrationPending(t *testing.T) {
	clash := fmt.Errorf("%w: the CNI uses 0x0f00", ErrMarkClash)
	for _, c := range []struct {
		name string
		err  error
		want migrationStep
	}{
		{"enforced", nil, migrationCommits},
		{"failed", errors.New("attaching nic_ingress: no such device"), migrationRollsBack},
		{"mark clash", clash, migrationWaits},
		{"mark clash, and stopping for it failed", errors.Join(clash, errors.New("writing settings: busy")), migrationWaits},
	} {
		if got := settlement(c.err); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
