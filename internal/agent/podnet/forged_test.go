package podnet

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// recordingHandler keeps the messages of every record logged through it.
type recordingHandler struct {
	mu   *sync.Mutex
	msgs *[]string
}

func newRecordingHandler() recordingHandler {
	return recordingHandler{mu: &sync.Mutex{}, msgs: &[]string{}}
}

func (h recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.msgs = append(*h.msgs, r.Message)
	return nil
}
func (h recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordingHandler) WithGroup(string) slog.Handler      { return h }

func (h recordingHandler) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range *h.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

// nlMessage is one netlink message: header and payload, padded.
func nlMessage(typ uint16, payload []byte) []byte {
	b := make([]byte, 16, 16+len(payload)+3)
	binary.NativeEndian.PutUint32(b[0:], uint32(16+len(payload)))
	binary.NativeEndian.PutUint16(b[4:], typ)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// forgedMessages are what a process of the pod sends the agent's event
// socket: an NLMSG_ERROR, a generic netlink header cut short, and a
// well-formed ESTABLISHED event of a connection that does not exist.
func forgedMessages(t *testing.T, family uint16) map[string][]byte {
	t.Helper()
	errno := make([]byte, 4)
	binary.NativeEndian.PutUint32(errno, uint32(0x100000000-int64(unix.EPERM)))
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(1, 0x1234)              // token
	ae.Uint16(2, unix.AF_INET)        // family
	ae.Bytes(5, []byte{192, 0, 2, 1}) // saddr4
	ae.Bytes(7, []byte{192, 0, 2, 2}) // daddr4
	ae.Bytes(9, []byte{0x9c, 0x40})   // sport
	ae.Bytes(10, binary.BigEndian.AppendUint16(nil, 5201))
	attrs, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		"NLMSG_ERROR":       nlMessage(unix.NLMSG_ERROR, errno),
		"short genl header": nlMessage(family, []byte{2, 1}),
		"ESTABLISHED event": nlMessage(family, append([]byte{2, 1, 0, 0}, attrs...)),
	}
}

// The MPTCP path manager family's id and its event group's, as the pod sees them.
func mptcpFamily(t *testing.T, nsPath string) (id uint16, eventGroup uint32) {
	t.Helper()
	fd, err := netnsutil.Open(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	c, err := genetlink.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f, err := c.GetFamily("mptcp_pm")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range f.Groups {
		if g.Name == "mptcp_pm_events" {
			eventGroup = g.ID
		}
	}
	return f.ID, eventGroup
}

// sendFromPod sends each message from a plain generic netlink socket opened
// in the pod's namespace (what any process of the pod may open, without a
// capability) to dst, and returns each send's error.
func sendFromPod(t *testing.T, nsPath string, dst *unix.SockaddrNetlink, msgs map[string][]byte) map[string]error {
	t.Helper()
	errs := map[string]error{}
	if err := netnsutil.Do(nsPath, func() error {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_GENERIC)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for name, m := range msgs {
			errs[name] = unix.Sendto(fd, m, 0, dst)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return errs
}

// A process of the pod that sends forged messages to the agent's event
// socket (unicast, which needs no capability) is refused by the kernel: the
// socket is connected to the kernel. Forged multicast to the event group
// (CAP_NET_ADMIN in the pod; the test runs as root) reaches the socket but
// is dropped, not being the kernel's. Neither ends the session nor opens a
// join, and the path manager still opens the joins of a real connection.
func TestForgedNetlinkMessagesNeitherStopThePathManagerNorOpenJoins(t *testing.T) {
	bed := newPMBed(t)
	h := newRecordingHandler()
	p := NewPathManagers(slog.New(h), PathManagerOptions{})
	t.Cleanup(p.Stop)
	if err := p.Sync(context.Background(), []Want{{Pod: bed.client, Joins: 1}}); err != nil {
		t.Fatal(err)
	}
	pm := p.get(bed.client)
	sess := pm.current.Load()
	for deadline := time.Now().Add(5 * time.Second); sess == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		sess = pm.current.Load()
	}
	if sess == nil {
		t.Fatal("the path manager has no session")
	}
	portID, err := sess.events.PortID()
	if err != nil {
		t.Fatal(err)
	}
	family, group := mptcpFamily(t, bed.client.NetNS)
	msgs := forgedMessages(t, family)

	for name, err := range sendFromPod(t, bed.client.NetNS, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Pid: portID}, msgs) {
		if !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("a process of the pod sent a forged %s to the agent's event socket: %v, want ECONNREFUSED", name, err)
		}
	}
	if group >= 1 && group <= 32 {
		for name, err := range sendFromPod(t, bed.client.NetNS, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (group - 1)}, msgs) {
			if err != nil {
				t.Errorf("multicasting a forged %s: %v", name, err)
			}
		}
	} else {
		t.Logf("the event group's id %d has no nl_groups bit: not multicasting forged messages", group)
	}

	time.Sleep(300 * time.Millisecond)
	if st := p.States(); len(st) != 1 || !st[0].Up || st[0].Restarts != 0 || pm.current.Load() != sess {
		t.Errorf("after forged messages the path manager's state is %+v (same session: %v), want it up in the same session", st, pm.current.Load() == sess)
	}
	for _, msg := range []string{"opening join", "opened joins"} {
		if n := h.count(msg); n != 0 {
			t.Errorf("%d %q log lines after forged messages: the path manager acted on a forged event", n, msg)
		}
	}
	if n := bed.joinsOfANewConnection(t); n != 1 {
		t.Errorf("a connection opened after the forged messages has %d joins, want 1", n)
	}
}
