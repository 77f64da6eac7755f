package bpfutil

import (
	"net"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// JoinAnswerFilter drops what a server sends a client's joins, SYN-ACKs
// excepted (bpf/test/drop_join_answers.c): the client sees each join
// established, and its acceptor's answer to the third ACK never arrives.
type JoinAnswerFilter struct {
	objs dropJoinAnswersObjects
	link link.Link
}

// DropJoinAnswers attaches a JoinAnswerFilter (TCX ingress) to interface
// ifname of the namespace at netns, for segments from serverPort; it drops
// nothing until Keep names the client port to spare. It is removed at the
// end of the test.
func DropJoinAnswers(t testing.TB, netns, ifname string, serverPort uint16) *JoinAnswerFilter {
	t.Helper()
	f := &JoinAnswerFilter{}
	if err := loadDropJoinAnswersObjects(&f.objs, nil); err != nil {
		t.Fatalf("loading the join answer filter: %v", err)
	}
	t.Cleanup(func() { _ = f.objs.Close() })
	if err := f.objs.ServerPort.Set(serverPort); err != nil {
		t.Fatal(err)
	}
	if err := netnsutil.Do(netns, func() error {
		iface, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		f.link, err = link.AttachTCX(link.TCXOptions{Interface: iface.Index, Program: f.objs.DropJoinAnswers, Attach: ebpf.AttachTCXIngress})
		return err
	}); err != nil {
		t.Fatalf("attaching the join answer filter to %s in %s: %v", ifname, netns, err)
	}
	t.Cleanup(f.Remove)
	return f
}

// Keep starts dropping, sparing the segments to client port port (the
// connection's first subflow).
func (f *JoinAnswerFilter) Keep(t testing.TB, port uint16) {
	t.Helper()
	if err := f.objs.KeepPort.Set(port); err != nil {
		t.Fatal(err)
	}
}

// Dropped is how many segments the filter dropped.
func (f *JoinAnswerFilter) Dropped(t testing.TB) uint64 {
	t.Helper()
	var n uint64
	if err := f.objs.Dropped.Get(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Remove detaches the filter: the joins' answers get through again.
func (f *JoinAnswerFilter) Remove() {
	if f.link != nil {
		_ = f.link.Close()
		f.link = nil
	}
}
