package agent

import (
	"errors"
	"fmt"
)

// syncRates writes the caps of every rule of plan under its id, and clears
// the caps of ids no rule holds any more. A retired rule that live
// connections still use keeps its caps (retireRules clears them with its
// id).
func (a *Agent) syncRates(plan *Plan, ids map[string]uint32) error {
	var errs []error
	keep := map[uint32]bool{}
	for name, id := range a.ruleIDs.ByName {
		if _, current := ids[name]; !current {
			keep[id] = true // retired, still in use
		}
	}
	for _, r := range plan.Rules {
		id, ok := ids[r.Name]
		if r.Rate == nil || !ok {
			continue
		}
		if err := a.dp.SetRateRule(id, *r.Rate); err != nil {
			errs = append(errs, fmt.Errorf("rule %q: rate: %w", r.Name, err))
			continue
		}
		keep[id] = true
	}
	capped, err := a.dp.RateRules()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, id := range capped {
		if !keep[id] {
			if err := a.dp.ClearRateRule(id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
