package framework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// DatapathEvidence is a watch's collector of what every agent's datapath
// on the bed knew when a transfer failed: its counters (drops by reason,
// police and window events, joins refused), its subflows and its
// connections, read from the maps the agent pinned, whichever mode it runs
// in.
func DatapathEvidence(bed *testbed.Bed) testbed.Collector {
	return func(dir string) error {
		var errs []error
		for _, n := range bed.Nodes {
			for _, pinDir := range pinnedDatapaths(bed.PinDir(n)) {
				name := fmt.Sprintf("node%d-datapath-%s.json", n.Index, strings.ReplaceAll(strings.TrimPrefix(pinDir, bed.PinDir(n)), "/", "_"))
				errs = append(errs, dumpDatapath(pinDir, filepath.Join(dir, name)))
			}
		}
		return errors.Join(errs...)
	}
}

// pinnedDatapaths finds the pin directories under root that hold a
// datapath (its table seed is the pin every datapath has).
func pinnedDatapaths(root string) []string {
	var dirs []string
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "table_seeds" {
			dirs = append(dirs, filepath.Dir(path))
		}
		return nil
	})
	return dirs
}

func dumpDatapath(pinDir, file string) error {
	dp, err := datapath.Load(datapath.Options{PinDir: pinDir})
	if err != nil {
		return fmt.Errorf("opening the datapath pinned in %s: %w", pinDir, err)
	}
	defer dp.Close()
	var dump struct {
		Stats       map[string]uint64
		Subflows    []datapath.Subflow
		Connections []datapath.Connection
		Errors      []string
	}
	stats, err := dp.Stats()
	dump.Stats = map[string]uint64{}
	for s, v := range stats {
		dump.Stats[observe.EventName(s)] = v
	}
	note := func(err error) {
		if err != nil {
			dump.Errors = append(dump.Errors, err.Error())
		}
	}
	note(err)
	dump.Subflows, err = datapath.PinnedSubflows(pinDir)
	note(err)
	dump.Connections, err = dp.Connections()
	note(err)
	b, err := json.MarshalIndent(dump, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}

// FinishTransfer stops srv and checks what arrived against what the
// sender reported (sendErr is the sender's own failure, if any), over MPTCP
// connections when mptcp, plain TCP ones otherwise. Any traffic failure
// fails the test with w's evidence. It returns the server's reports by the
// sender's address.
func FinishTransfer(t testing.TB, w *testbed.Watch, srv *testbed.TrafficServer, sent []testbed.SenderReport, sendErr error, mptcp bool) map[string]testbed.ServerReport {
	t.Helper()
	byRemote, _ := FinishTransferOrRetryStall(t, w, srv, sent, sendErr, mptcp, "")
	return byRemote
}

// FinishTransferOrRetryStall is FinishTransfer for a test that names why a
// stall may be tried again (stallRetry): when every failure is a stall
// (what arrived is what was sent, nothing broke), the evidence is kept,
// the retry logged and recorded (Watch.Retry), and it returns false.
// A changed or broken stream fails the test as FinishTransfer does.
func FinishTransferOrRetryStall(t testing.TB, w *testbed.Watch, srv *testbed.TrafficServer, sent []testbed.SenderReport, sendErr error, mptcp bool,
	stallRetry string) (map[string]testbed.ServerReport, bool) {
	t.Helper()
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	got, err := srv.Reports()
	if err != nil {
		t.Fatal(err)
	}
	if len(sent) == 0 {
		w.Fail(fmt.Errorf("the sender reported no connection: %w", sendErr))
	}
	byRemote, err := testbed.MatchReports(sent, got)
	if err != nil {
		// Fails the test unless every failure is a stall and stallRetry
		// names why it may be tried again.
		w.Retry(err, stallRetry)
		return nil, false
	}
	for _, s := range sent {
		if r := byRemote[s.Local]; r.MPTCP != mptcp {
			t.Fatalf("connection %d: MPTCP %v, want %v: %+v", s.Conn, r.MPTCP, mptcp, r)
		}
	}
	return byRemote, true
}

// Sending is a transfer SendInBackground started: what the sender reported
// and how it ended, once it has.
type Sending struct {
	Sent []testbed.SenderReport
	Err  error
}

// SendInBackground starts one MPTCP connection from client to server:port
// with the traffic binary for length (seeded by the port), with the
// sender's further args, and returns at once; the channel gives its result.
func SendInBackground(ctx context.Context, bed *testbed.Bed, traffic string, client, server *testbed.Pod, port int, length time.Duration, args ...string) <-chan Sending {
	done := make(chan Sending, 1)
	go func() {
		sent, err := bed.Send(ctx, traffic, client, netip.AddrPortFrom(server.Addr, uint16(port)), true,
			append([]string{"-conns", "1", "-duration", length.String(), "-seed", strconv.Itoa(port)}, args...)...)
		done <- Sending{sent, err}
	}()
	return done
}
