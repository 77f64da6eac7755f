package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// finishTransfer stops srv and checks what arrived against what the
// sender reported (sendErr is the sender's own failure, if any), over MPTCP
// connections. Any traffic failure fails the test with w's evidence. It
// returns the server's reports by the sender's address.
func finishTransfer(t *testing.T, w *testbed.Watch, srv *testbed.TrafficServer, sent []testbed.SenderReport, sendErr error) map[string]testbed.ServerReport {
	t.Helper()
	return finishTransferOver(t, w, srv, sent, sendErr, true)
}

// finishTransferOver is finishTransfer over MPTCP connections, or plain TCP
// ones.
func finishTransferOver(t *testing.T, w *testbed.Watch, srv *testbed.TrafficServer, sent []testbed.SenderReport, sendErr error, mptcp bool) map[string]testbed.ServerReport {
	t.Helper()
	return framework.FinishTransfer(t, w, srv, sent, sendErr, mptcp)
}

// sendInBackground is framework.SendInBackground with the test's traffic
// binary.
func sendInBackground(ctx context.Context, bed *testbed.Bed, client, server *testbed.Pod, port int, length time.Duration, args ...string) <-chan framework.Sending {
	return framework.SendInBackground(ctx, bed, bins.Traffic, client, server, port, length, args...)
}
