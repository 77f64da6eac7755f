package testutil

import (
	"errors"
	"net"
	"strconv"
	"testing"
	"time"
)

func TestEventuallyReturnsOnceTheCheckHolds(t *testing.T) {
	calls := 0
	Eventually(t, time.Second, time.Millisecond, "the third call", func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 3 {
		t.Errorf("check called %d times, want 3", calls)
	}
}

func TestFreePortCanBeListenedOn(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(FreePort(t)))
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
}
