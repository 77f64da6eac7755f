package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// The second half of a migration (migrate.go): the switch of the links to
// the new programs, the catch-up, and the commit or the rollback.

// switchLinks moves every pinned link to this datapath's program for its
// hook, remembering the program it had so a rollback can put it back.
func (d *Datapath) switchLinks() error {
	for _, h := range Hooks {
		dir := filepath.Join(d.pinDir, linkPinSubdir, string(h))
		entries, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		prog, _ := d.hookProgram(h)
		for _, e := range entries {
			pin := filepath.Join(dir, e.Name())
			if err := d.switchLink(pin, prog); err != nil {
				return err
			}
		}
	}
	return nil
}

func (d *Datapath) switchLink(pin string, prog *ebpf.Program) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return fmt.Errorf("pinned link %s: %w", pin, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return fmt.Errorf("pinned link %s: %w", pin, err)
	}
	old, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		// A link whose interface is gone has no program to keep; the
		// reconcile drops it.
		return nil //nolint:nilerr // see above
	}
	if err := l.Update(prog); err != nil {
		_ = old.Close()
		return fmt.Errorf("switching pinned link %s to the new program: %w", pin, err)
	}
	d.migration.switched = append(d.migration.switched, switchedLink{pin: pin, oldProg: old})
	return nil
}

// catchUpDelay lets program runs that started on the old programs before
// the switch end: they are short (microseconds) and never sleep.
const catchUpDelay = 20 * time.Millisecond

// catchUp carries into the new maps what the old programs wrote after the
// copy: for per-CPU maps (counters) the growth of every integer field,
// added to what the new programs counted since; for hash maps and tables
// the entries they added (a subflow placed in the meantime keeps its path).
// Updates the old programs made to entries that already existed are not
// carried (a connection's used-path bits, a rule's round-robin cursor).
func (d *Datapath) catchUp() error {
	time.Sleep(catchUpDelay)
	var errs []error
	for _, mm := range d.migration.maps {
		catchUp := mm.catchUp
		if mm.table {
			catchUp = func() error { return d.catchUpTable(mm) }
		}
		if err := catchUp(); err != nil {
			errs = append(errs, fmt.Errorf("catching up map %s: %w", mm.name, err))
		}
	}
	return errors.Join(errs...)
}

func (mm *migratedMap) catchUp() error {
	t := mm.newLayout.Type
	if !perCPU(t) && t != ebpf.Hash && t != ebpf.LRUHash {
		return nil
	}
	var k, v []byte
	var vs [][]byte
	it := mm.old.Iterate()
	for {
		var ok bool
		if mm.base != nil {
			ok = it.Next(&k, &vs)
		} else {
			ok = it.Next(&k, &v)
		}
		if !ok {
			break
		}
		nk, err := mm.convertKey(k)
		if err != nil || nk == nil {
			continue
		}
		if mm.base == nil {
			nv, err := mm.convertOne(v)
			if err != nil {
				continue
			}
			if err := mm.new.Update(nk, nv, ebpf.UpdateNoExist); err == nil {
				mm.caughtUp++
			}
			continue
		}
		now, err := mm.convertPerCPU(vs)
		if err != nil {
			continue
		}
		base := mm.base[string(nk)]
		if base == nil {
			base = make([][]byte, len(now))
			for i := range base {
				base[i] = make([]byte, mm.newLayout.ValueSize)
			}
		}
		var cur [][]byte
		if err := mm.new.Lookup(nk, &cur); err != nil {
			cur = make([][]byte, len(now))
			for i := range cur {
				cur[i] = make([]byte, mm.newLayout.ValueSize)
			}
		}
		// The read-add-write below races with the new programs on each
		// CPU: increments they make in that window (microseconds) are
		// lost. Documented.
		for cpu := range cur {
			addDeltas(cur[cpu], now[cpu], base[cpu], mm.newLayout.Value)
		}
		if err := mm.new.Put(nk, cur); err != nil {
			return err
		}
		mm.deltas++
	}
	return it.Err()
}

// MigrationPending says whether this datapath converted pinned maps that
// CommitMigration or RollbackMigration must settle.
func (d *Datapath) MigrationPending() bool { return d.migration != nil && len(d.migration.maps) > 0 }

// MigratedMaps names the maps a pending migration converted.
func (d *Datapath) MigratedMaps() []string {
	if d.migration == nil {
		return nil
	}
	return d.migration.names()
}

// CommitMigration makes the migrated maps the pinned ones: each is pinned
// in a staging directory and renamed over its old pin (a rename on bpffs is
// atomic, so there is always a map at the pin). Then pins of maps this
// binary no longer has are removed and the layout marker is written.
func (d *Datapath) CommitMigration() error {
	mig := d.migration
	if mig == nil {
		return nil
	}
	staging := filepath.Join(d.pinDir, stagingSubdir)
	if err := os.MkdirAll(staging, 0o700); err != nil {
		return err
	}
	for _, mm := range mig.maps {
		tmp := filepath.Join(staging, mm.name)
		_ = os.Remove(tmp) // left by an agent killed mid-commit
		if err := mm.new.Pin(tmp); err != nil {
			return fmt.Errorf("pinning migrated map %s: %w", mm.name, err)
		}
		if err := os.Rename(tmp, filepath.Join(d.pinDir, mm.name)); err != nil {
			return fmt.Errorf("replacing the pin of map %s: %w", mm.name, err)
		}
	}
	if err := os.Remove(staging); err != nil {
		return err
	}
	if err := d.removeForeignPins(); err != nil {
		return err
	}
	if err := writeLayoutMarker(d.pinDir, mig.hash); err != nil {
		return err
	}
	mig.closeMaps()
	d.migration = nil
	return nil
}

// removeForeignPins unpins maps an earlier release pinned that this one
// does not have any more: no program uses them after the switch.
func (d *Datapath) removeForeignPins() error {
	entries, err := os.ReadDir(d.pinDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || n == layoutMarkerPin || slices.Contains(d.mapNames, n) {
			continue
		}
		if err := os.Remove(filepath.Join(d.pinDir, n)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RollbackMigration gives up a pending migration: every link switched to a
// new program gets its old program back, links the new programs got since
// are removed, and the new maps are dropped. The old pins were never
// touched, so the previous release's datapath runs on as before.
// What the new programs recorded in the meantime is lost.
func (d *Datapath) RollbackMigration() error {
	mig := d.migration
	if mig == nil {
		return nil
	}
	var errs []error
	for _, s := range mig.switched {
		l, err := link.LoadPinnedLink(s.pin, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue // the reconcile removed it
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := l.Update(s.oldProg); err != nil {
			errs = append(errs, fmt.Errorf("restoring the old program on %s: %w", s.pin, err))
		}
		_ = l.Close()
	}
	for _, h := range Hooks {
		dir := filepath.Join(d.pinDir, linkPinSubdir, string(h))
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if !mig.linksBefore[filepath.Join(dir, e.Name())] {
				if err := d.Detach(Attachment{Interface: unescapePinName(e.Name()), Hook: h}); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	mig.closeMaps()
	d.migration = nil
	return errors.Join(errs...)
}
