package linkwatch

import (
	"sync"
	"time"
)

// Damping holds a flapping link down: after Transitions losses within
// Window, the link counts as down for Hold after it last came back, so that
// subflows are not moved back onto a path that is about to fail again.
// Transitions 0 turns damping off.
type Damping struct {
	Transitions int           `json:"transitions,omitempty"`
	Window      time.Duration `json:"window,omitempty"`
	Hold        time.Duration `json:"hold,omitempty"`
}

// Damper applies Damping to links by name. It is safe for concurrent use:
// link events and reconciles both report to it.
type Damper struct {
	cfg   Damping
	mu    sync.Mutex
	links map[string]*linkHistory
}

type linkHistory struct {
	up        bool
	losses    []time.Time // within the window, oldest first
	heldUntil time.Time
}

// NewDamper returns a damper with cfg.
func NewDamper(cfg Damping) *Damper {
	return &Damper{cfg: cfg, links: map[string]*linkHistory{}}
}

// Observe records that link is up or not at now and returns whether it is
// to be used, and, when it is up but held down, the moment the hold ends
// (zero otherwise): the caller looks again then.
func (d *Damper) Observe(link string, up bool, now time.Time) (usable bool, until time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, seen := d.links[link]
	if !seen {
		h = &linkHistory{up: up}
		d.links[link] = h
	}
	if d.cfg.Transitions <= 0 {
		h.up = up
		return up, time.Time{}
	}
	if seen && h.up && !up {
		h.losses = append(h.losses, now)
		for len(h.losses) > 0 && now.Sub(h.losses[0]) > d.cfg.Window {
			h.losses = h.losses[1:]
		}
		if len(h.losses) >= d.cfg.Transitions {
			// Held from the loss; the hold runs from when the link
			// is last seen coming back (below).
			h.heldUntil = now.Add(d.cfg.Hold)
		}
	}
	if seen && !h.up && up && h.heldUntil.After(now) {
		h.heldUntil = now.Add(d.cfg.Hold)
	}
	h.up = up
	if up && h.heldUntil.After(now) {
		return false, h.heldUntil
	}
	return up, time.Time{}
}

// Held reports whether link is up but held down at now.
func (d *Damper) Held(link string, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.links[link]
	return h != nil && h.up && h.heldUntil.After(now)
}
