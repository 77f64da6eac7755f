package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

const linkPinSubdir = "links"

// Hook names the place a program runs, used in pin names and status.
type Hook string

const (
	// HookPodEgress is the TC ingress of a pod's host-side veth: what the pod sends.
	HookPodEgress Hook = "pod-egress"
	// HookPodIngress is the TC egress of a pod's host-side veth: what the
	// pod receives. Actors that steer the pod's own sending (backup) or the
	// peer's (window) rewrite packets here, on their way into the pod.
	HookPodIngress Hook = "pod-ingress"
	// HookNICIngress is the TC ingress of a path's NIC.
	HookNICIngress Hook = "nic-ingress"
	// HookNICEgress is the TC egress of a path's NIC, where the shape actor
	// classifies packets into the agent's HTB classes.
	HookNICEgress Hook = "nic-egress"
)

// Hooks lists every hook, in the order the agent attaches them.
var Hooks = []Hook{HookPodEgress, HookPodIngress, HookNICIngress, HookNICEgress}

// Attachment is one program attached to one interface through a TCX link.
type Attachment struct {
	Interface string
	Hook      Hook
}

// hookProgram returns the program for a hook and where it attaches.
func (d *Datapath) hookProgram(h Hook) (*ebpf.Program, ebpf.AttachType) {
	switch h {
	case HookPodEgress:
		return d.objs.PodEgress, ebpf.AttachTCXIngress
	case HookPodIngress:
		return d.objs.PodIngress, ebpf.AttachTCXEgress
	case HookNICEgress:
		return d.objs.NicEgress, ebpf.AttachTCXEgress
	default:
		return d.objs.NicIngress, ebpf.AttachTCXIngress
	}
}

// linkPin is links/<hook>/<interface>. bpffs refuses names with a dot, which
// interface names may have (eth0.100), so dots are escaped.
func (d *Datapath) linkPin(a Attachment) string {
	return filepath.Join(d.pinDir, linkPinSubdir, string(a.Hook), escapePinName(a.Interface))
}

func escapePinName(s string) string {
	return strings.ReplaceAll(url.PathEscape(s), ".", "%2E")
}

func unescapePinName(s string) string {
	out, err := url.PathUnescape(s)
	if err != nil {
		return s
	}
	return out
}

// Attach attaches the hook's program to the interface with a TCX link and
// pins the link. A link pinned by an earlier agent is adopted and switched to
// this datapath's program atomically, or replaced by a new link at the head
// before it goes when other programs run before it (readopt), so traffic
// never runs unsteered. TCX
// links sit beside other tools' programs; nothing else on the hook is touched.
// A new link goes first on its hook: a CNI's program that hands packets to the
// stack ends the hook's chain (Cilium's on its pods' veths returns TC_ACT_OK),
// and a program after it would never run, leaving the pod's subflows unmarked.
func (d *Datapath) Attach(a Attachment) error {
	iface, err := net.InterfaceByName(a.Interface)
	if err != nil {
		return fmt.Errorf("interface %q: %w", a.Interface, err)
	}
	prog, attachType := d.hookProgram(a.Hook)
	pin := d.linkPin(a)

	if d.pinDir != "" {
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			defer l.Close()
			info, ierr := l.Info()
			if ierr == nil && info.TCX() != nil && int(info.TCX().Ifindex) == iface.Index {
				done, err := d.readopt(l, info, prog, attachType, iface.Index)
				if done || err != nil {
					return err
				}
			}
			// The interface was re-created since, or the link is not
			// first: the old link goes when this function closes it.
			_ = l.Unpin()
		}
	}

	l, err := link.AttachTCX(link.TCXOptions{Interface: iface.Index, Program: prog, Attach: attachType, Anchor: link.Head()})
	if err != nil {
		return fmt.Errorf("attaching %s to %s: %w", a.Hook, a.Interface, err)
	}
	defer l.Close()
	if d.pinDir == "" {
		return errors.New("attach needs a pin directory: an unpinned link would detach when the agent exits")
	}
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		return err
	}
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pinning link %s: %w", pin, err)
	}
	return nil
}

// readopt switches a pinned link of the hook to prog when it runs first on
// its hook (done). One that other programs run before (an earlier agent
// attached links last; another tool may have gone to the head since) would
// see only what they hand on, so it is not done: a new link goes first, and
// this one is detached once the new one runs. Only when the old link holds
// prog itself, which the kernel allows on a hook once, is it detached first.
func (d *Datapath) readopt(old link.Link, info *link.Info, prog *ebpf.Program, at ebpf.AttachType, ifindex int) (done bool, err error) {
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
	if err != nil {
		return false, fmt.Errorf("listing the programs on interface %d: %w", ifindex, err)
	}
	if len(res.Programs) > 0 {
		if first, _ := res.Programs[0].LinkID(); first == info.ID {
			if err := old.Update(prog); err != nil {
				return false, fmt.Errorf("updating pinned link: %w", err)
			}
			return true, nil
		}
	}
	if progInfo, err := prog.Info(); err == nil {
		if id, ok := progInfo.ID(); ok && id == info.Program {
			if err := old.Unpin(); err != nil {
				return false, err
			}
			return false, old.Close()
		}
	}
	return false, nil
}

// Detach removes the hook's program from the interface, if attached by us.
func (d *Datapath) Detach(a Attachment) error {
	pin := d.linkPin(a)
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("loading pinned link %s: %w", pin, err)
	}
	defer l.Close()
	if err := l.Unpin(); err != nil {
		return err
	}
	// The interface may already be gone, taking the link with it.
	if err := l.Detach(); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("detaching %s from %s: %w", a.Hook, a.Interface, err)
	}
	return nil
}

// Attachments lists the links pinned by this datapath.
func (d *Datapath) Attachments() ([]Attachment, error) {
	var out []Attachment
	for _, hook := range Hooks {
		entries, err := os.ReadDir(filepath.Join(d.pinDir, linkPinSubdir, string(hook)))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			out = append(out, Attachment{Interface: unescapePinName(e.Name()), Hook: hook})
		}
	}
	return out, nil
}
