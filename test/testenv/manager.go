package testenv

import (
	"context"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/mptcp-operator/mptcp-operator/internal/controller"
)

// Manager is the project's controller running in the test process.
type Manager struct {
	tb     testing.TB
	cancel context.CancelFunc
	done   chan error
}

// StartManager runs the same controllers as cmd/controller against env, with
// the admin's credentials, until Stop or the end of tb.
func StartManager(tb testing.TB, env *Env) *Manager {
	tb.Helper()
	return StartManagerWith(tb, env, env.Config)
}

// StartManagerWith is StartManager with the given credentials, e.g. the
// controller's service account impersonated, to prove its RBAC suffices.
func StartManagerWith(tb testing.TB, env *Env, cfg *rest.Config) *Manager {
	tb.Helper()
	// Controller logs go to stderr only when asked: they drown test output.
	w := io.Discard // an io.Writer, so os.Stderr fits too
	if os.Getenv("MPTCP_TEST_LOG") != "" {
		w = os.Stderr
	}
	log.SetLogger(zap.New(zap.WriteTo(w), zap.UseDevMode(true)))
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  env.Scheme,
		Cache:   controller.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Tests start several managers in one process, one after the other.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		tb.Fatalf("manager: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := controller.Setup(ctx, mgr); err != nil {
		cancel()
		tb.Fatalf("setup controllers: %v", err)
	}
	m := &Manager{tb: tb, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- mgr.Start(ctx) }()
	tb.Cleanup(m.Stop)
	return m
}

// Stop stops the manager and waits for it; calling it twice is harmless.
func (m *Manager) Stop() {
	if m.cancel == nil {
		return
	}
	m.cancel()
	if err := <-m.done; err != nil {
		// A runnable that outlived the grace period is still running
		// now: its stack names it.
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 2)
		m.tb.Errorf("manager stopped with an error: %v\ngoroutines at that moment:\n%s", err, stacks.String())
	}
	m.cancel = nil
}

// WaitIdle waits until the controllers have had nothing to do for quiet: no
// reconcile running and none finished during that time. quiet must exceed
// the longest delay a controller queues work with (policystatus.Coalesce).
// Queue depth is not used: managers started one after the other in a process
// share its gauge, and a stopped manager's leftover items would stay counted.
func WaitIdle(tb testing.TB, quiet, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	last := -1.0
	stableSince := time.Now()
	for time.Now().Before(deadline) {
		total, busy := reconcileActivity(tb)
		if busy || total != last {
			last = total
			stableSince = time.Now()
		} else if time.Since(stableSince) >= quiet {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("controllers still busy after %s", timeout)
}

// reconcileActivity sums reconciles finished by our controllers and says
// whether any worker is running.
func reconcileActivity(tb testing.TB) (float64, bool) {
	families, err := metrics.Registry.Gather()
	if err != nil {
		tb.Fatalf("gather metrics: %v", err)
	}
	var total float64
	busy := false
	for _, f := range families {
		for _, m := range f.GetMetric() {
			ours := false
			for _, l := range m.GetLabel() {
				if (l.GetName() == "controller" || l.GetName() == "name") && strings.HasPrefix(l.GetValue(), "mptcp-") {
					ours = true
				}
			}
			if !ours {
				continue
			}
			switch f.GetName() {
			case "controller_runtime_reconcile_total":
				total += m.GetCounter().GetValue()
			case "controller_runtime_active_workers":
				if m.GetGauge().GetValue() > 0 {
					busy = true
				}
			}
		}
	}
	return total, busy
}

// Reconciles returns how many reconciles the named controller has finished in
// this process, so a test can tell "nothing written" from "nothing ran".
func Reconciles(tb testing.TB, controllerName string) float64 {
	tb.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		tb.Fatalf("gather metrics: %v", err)
	}
	var total float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controllerName {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}
