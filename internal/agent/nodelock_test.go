package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A second agent of a node waits until the first one lets go of the node,
// also when the first removed the node's state directory meanwhile (an
// uninstall): it then holds the directory that is there, not the removed
// one, so that a third waits for it.
func TestSecondAgentOfANodeWaitsForTheFirst(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := filepath.Join(t.TempDir(), "node1")
	first, err := LockNode(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan *NodeLock, 1)
	go func() {
		l, err := LockNode(dir, log)
		if err != nil {
			t.Error(err)
		}
		second <- l
	}()
	select {
	case <-second:
		t.Fatal("the second agent went on while the first held the node")
	case <-time.After(500 * time.Millisecond):
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	first.Unlock()
	var l *NodeLock
	select {
	case l = <-second:
	case <-time.After(5 * time.Second):
		t.Fatal("the second agent still waits after the first let go")
	}
	// Let go before TempDir's cleanup, and wait for the third agent: one
	// still running would make the directory again under the cleanup.
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			l.Unlock()
		}
	}
	defer unlock()
	if same, err := samePath(l.f, dir); err != nil || !same {
		t.Fatalf("the second agent holds a removed directory (%v, %v)", same, err)
	}
	third := make(chan struct{})
	t.Cleanup(func() { <-third })
	go func() {
		if l, err := LockNode(dir, log); err == nil {
			l.Unlock()
		}
		close(third)
	}()
	select {
	case <-third:
		t.Fatal("a third agent went on while the second held the node")
	case <-time.After(300 * time.Millisecond):
	}
	unlock()
	select {
	case <-third:
	case <-time.After(5 * time.Second):
		t.Fatal("the third agent still waits after the second let go")
	}
}
