package agent

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// RateLimits are a rule's rate caps in bits per second, named as
// api/v1alpha1 CompiledRateLimits.
type RateLimits struct {
	// Mode is window, police or shape.
	Mode string `json:"mode"`
	// PerConnection caps each MPTCP connection (all its subflows).
	PerConnection *resource.Quantity `json:"perConnection,omitempty"`
	// PerPod caps each selected pod (shape: on each path's NIC).
	PerPod *resource.Quantity `json:"perPod,omitempty"`
	// PerPath caps the rule's traffic on a path of this node.
	PerPath []PathRate `json:"perPath,omitempty"`
	// Direction is what police caps: egress (what the pod sends), ingress
	// (what it receives) or both (the default). window always caps what
	// the pod receives, shape what it sends.
	Direction string `json:"direction,omitempty"`
	// BurstBytes overrides the bucket depth (datapath.DefaultBurst).
	BurstBytes uint64 `json:"burstBytes,omitempty"`
}

// PathRate caps a rule's traffic on one path.
type PathRate struct {
	Path string            `json:"path"`
	Rate resource.Quantity `json:"rate"`
}

// capped is rate bounded by a path's capacity (0: unbounded).
func capped(rate, capacity uint64) uint64 {
	if capacity > 0 {
		return min(rate, capacity)
	}
	return rate
}

func bps(q *resource.Quantity) uint64 {
	if q == nil || q.Sign() <= 0 {
		return 0
	}
	return uint64(q.Value())
}

// datapathConfig translates the caps for the datapath; paths maps names to
// the node's paths.
func (l *RateLimits) datapathConfig(r Rule, paths map[string]Path) (datapath.RateConfig, error) {
	c := datapath.RateConfig{
		PerConnection:         bps(l.PerConnection),
		PerPod:                bps(l.PerPod),
		HeadersMayBeRewritten: r.HeaderRewriting,
		BurstBytes:            l.BurstBytes,
	}
	switch l.Mode {
	case "window":
		c.Mode = datapath.RateWindow
	case "police":
		c.Mode = datapath.RatePolice
	case "shape":
		c.Mode = datapath.RateShape
	default:
		return c, fmt.Errorf("mode: %q is not one of window, police, shape", l.Mode)
	}
	switch l.Direction {
	case "", "both":
		c.Directions = datapath.Egress | datapath.Ingress
	case "egress":
		c.Directions = datapath.Egress
	case "ingress":
		c.Directions = datapath.Ingress
	default:
		return c, fmt.Errorf("direction: %q is not one of egress, ingress, both", l.Direction)
	}
	if c.Mode != datapath.RatePolice && l.Direction != "" {
		return c, fmt.Errorf("direction: only police takes one (%s acts in one direction)", l.Mode)
	}
	for _, q := range []*resource.Quantity{l.PerConnection, l.PerPod} {
		if q != nil && q.Sign() <= 0 {
			return c, fmt.Errorf("rates must be positive, got %s", q.String())
		}
	}
	for j, pr := range l.PerPath {
		p, ok := paths[pr.Path]
		if !ok {
			return c, fmt.Errorf("perPath[%d]: no path named %q on this node", j, pr.Path)
		}
		if pr.Rate.Sign() <= 0 {
			return c, fmt.Errorf("perPath[%d]: rate must be positive, got %s", j, pr.Rate.String())
		}
		if c.PerPath == nil {
			c.PerPath = map[uint32]uint64{}
		}
		if _, dup := c.PerPath[p.Index]; dup {
			return c, fmt.Errorf("perPath[%d]: path %q appears twice", j, pr.Path)
		}
		c.PerPath[p.Index] = capped(uint64(pr.Rate.Value()), p.Capacity)
	}
	return c, c.Validate()
}

func (l *RateLimits) validate(r Rule, paths map[string]Path) error {
	_, err := l.datapathConfig(r, paths)
	return err
}

// applyRates writes the rate caps of every rule of cfg under its id, and
// clears the caps of ids no rule holds any more. A retired rule that live
// connections still use keeps its caps (retireRules clears them with its
// id).
func (a *Agent) applyRates(cfg *Config, paths map[string]Path, ids map[string]uint32) error {
	var errs []error
	keep := map[uint32]bool{}
	for name, id := range a.ruleIDs.ByName {
		if _, current := ids[name]; !current {
			keep[id] = true // retired, still in use
		}
	}
	for _, r := range cfg.Rules {
		id, ok := ids[r.Name]
		if r.Rate == nil || !ok {
			continue
		}
		c, err := r.Rate.datapathConfig(r, paths)
		if err == nil {
			err = a.dp.SetRateRule(id, c)
		}
		if err != nil {
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
