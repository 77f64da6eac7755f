package agent

import (
	"errors"
	"fmt"
)

// FinishMigration settles a map-layout migration New started, given the
// outcome of the first reconcile: success makes the migrated maps the
// pinned ones; failure rolls back (the previous release's programs return
// to the links and its pins were never touched) and is returned, so that
// the agent exits and the old datapath keeps steering until a restart.
func (a *Agent) FinishMigration(reconcileErr error) error {
	if !a.dp.MigrationPending() {
		return nil
	}
	maps := a.dp.MigratedMaps()
	if reconcileErr != nil {
		err := fmt.Errorf("first reconcile after migrating maps %v failed, migration rolled back: %w", maps, reconcileErr)
		return errors.Join(err, a.dp.RollbackMigration())
	}
	if err := a.dp.CommitMigration(); err != nil {
		return errors.Join(fmt.Errorf("committing the migration of maps %v: %w", maps, err), a.dp.RollbackMigration())
	}
	a.log.Info("map migration committed", "maps", maps)
	return nil
}
