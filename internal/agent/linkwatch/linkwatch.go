// Package linkwatch tells the agent, as it happens, when a network interface
// of its namespace loses or regains its carrier, appears, disappears or is
// renamed. A reconcile reads links only every resync (30 s in kube mode):
// without these events a path whose NIC failed would keep taking subflows
// until then.
package linkwatch

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Change is one interface's new state.
type Change struct {
	Name  string
	Index int
	// Running: administratively up and with a carrier (IFF_RUNNING), the
	// test a reconcile applies (the agent's syncNICs).
	Running bool
	// Gone: the interface was deleted, or renamed away from Name.
	Gone bool
}

// Handler receives changes, one at a time, in the order the kernel sent
// them. resync says events may have been lost (the subscription was
// restarted): the handler should re-read every link.
type Handler func(c Change, resync bool)

// receiveBuffer is the subscription socket's buffer: about 4000 link
// messages.
const receiveBuffer = 4 << 20

// retryDelay is how long Watch waits before subscribing again after the
// subscription failed (the socket's buffer overflowed, typically): each
// time asks for a reconcile, so it also bounds how often a flood of events
// makes the agent reconcile.
const retryDelay = time.Second

// Watch delivers the link changes of the calling thread's network namespace
// to h until ctx ends. It subscribes again whenever the subscription ends
// with an error, telling h to resync.
func Watch(ctx context.Context, log *slog.Logger, h Handler) {
	first := true
	for ctx.Err() == nil {
		// Anew each time: the listing that starts a subscription fills
		// it, and a deletion lost with the old one must not make a
		// reused index look like a rename.
		names := map[int]string{}
		if err := watchOnce(ctx, names, h, !first); err != nil {
			log.Error("link events: subscription ended; subscribing again", "err", err)
		}
		first = false
		select {
		case <-ctx.Done():
		case <-time.After(retryDelay):
		}
	}
}

func watchOnce(ctx context.Context, names map[int]string, h Handler, resync bool) error {
	updates := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	failed := make(chan error, 1)
	err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) {
			select {
			case failed <- err:
			default:
			}
		},
		// The links as they are now come first, so that names is
		// complete and renames are recognised.
		ListExisting: true,
		// Pods come and go with veths in this namespace, and a pod
		// with CAP_NET_ADMIN can flap its end: room for bursts, so
		// that a path NIC's event is not lost with theirs.
		ReceiveBufferSize:      receiveBuffer,
		ReceiveBufferForceSize: true, // past rmem_max: the agent has CAP_NET_ADMIN
	})
	if err != nil {
		return fmt.Errorf("subscribing to link events: %w", err)
	}
	if resync {
		h(Change{}, true)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return err
		case u, ok := <-updates:
			if !ok {
				return fmt.Errorf("link event channel closed")
			}
			for _, c := range changesOf(u, names) {
				h(c, false)
			}
		}
	}
}

// changesOf turns one netlink update into changes, keeping names (index to
// name) current: a rename is the old name gone and the new one present.
func changesOf(u netlink.LinkUpdate, names map[int]string) []Change {
	attrs := u.Attrs()
	if attrs == nil {
		return nil
	}
	idx, name := attrs.Index, attrs.Name
	if u.Header.Type == unix.RTM_DELLINK {
		delete(names, idx)
		return []Change{{Name: name, Index: idx, Gone: true}}
	}
	var out []Change
	if old, ok := names[idx]; ok && old != name {
		out = append(out, Change{Name: old, Index: idx, Gone: true})
	}
	names[idx] = name
	running := attrs.Flags&net.FlagUp != 0 && attrs.Flags&net.FlagRunning != 0
	return append(out, Change{Name: name, Index: idx, Running: running})
}
