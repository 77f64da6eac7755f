package agent

import (
	"errors"
	"fmt"
)

// FinishMigration settles a map-layout migration New started, given the
// outcome of a reconcile (callers pass every one's; once settled it does
// nothing): success makes the migrated maps the pinned ones; failure rolls
// back (the previous release's programs return to the links and its pins
// were never touched) and is returned, so that the agent exits and the old
// datapath keeps steering until a restart. A reconcile refused for a mark
// clash settles nothing: the clash is the node's, not the new programs',
// which hold the node observe-only as it needs, where the old ones put
// back would mark the CNI's bits (and the restarted agent would find the
// clash again, a restart loop).
func (a *Agent) FinishMigration(reconcileErr error) error {
	if !a.dp.MigrationPending() {
		return nil
	}
	maps := a.dp.MigratedMaps()
	switch settlement(reconcileErr) {
	case migrationWaits:
		if !a.migrationHeld {
			a.log.Warn("map migration waits for the mark clash to end", "maps", maps)
			a.migrationHeld = true
		}
		return nil
	case migrationRollsBack:
		err := fmt.Errorf("the reconcile that settles the migration of maps %v failed, migration rolled back: %w", maps, reconcileErr)
		return errors.Join(err, a.dp.RollbackMigration())
	}
	if err := a.dp.CommitMigration(); err != nil {
		return errors.Join(fmt.Errorf("committing the migration of maps %v: %w", maps, err), a.dp.RollbackMigration())
	}
	a.log.Info("map migration committed", "maps", maps)
	return nil
}

// migrationStep is what a reconcile's outcome does to a pending migration.
type migrationStep int

const (
	migrationCommits migrationStep = iota
	migrationRollsBack
	migrationWaits
)

// settlement is what a reconcile that returned reconcileErr does to a
// pending migration (FinishMigration).
func settlement(reconcileErr error) migrationStep {
	switch {
	case errors.Is(reconcileErr, ErrMarkClash):
		return migrationWaits
	case reconcileErr != nil:
		return migrationRollsBack
	}
	return migrationCommits
}
