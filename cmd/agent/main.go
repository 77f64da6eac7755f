// Command agent is the mptcp-operator node agent. It runs in a node's network
// namespace, loads the datapath and keeps the node in line with its
// MPTCPNodeState: `agent -config settings.yaml -node-state node.yaml` (file
// mode) enforces the node state of a YAML file until SIGTERM (leaving the
// datapath pinned and steering), SIGHUP re-reads both files, and
// `agent -config settings.yaml -uninstall` removes everything the agent
// created. With -kubeconfig and -node it enforces the node's MPTCPNodeState
// from the API instead (kube mode, docs/agent.md). Either way -config
// supplies only the node-local settings (pin and state directories, tables,
// mark mask, observe-only).
// With -daemonset (the chart passes its own), a stopping agent whose
// DaemonSet was deleted (helm uninstall) removes everything, as -uninstall
// does; one that is only replaced (an upgrade) keeps its datapath steering.
// It serves Prometheus metrics, /healthz and /readyz on -metrics-addr, and
// per-connection detail to root on the unix socket <stateDir>/agent.sock.
// In a container, -proc-sys names where the host's /proc/sys/net is mounted
// writable (the container's own /proc/sys is read-only).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/cni"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/buildinfo"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/preload"
)

// flapDamping, joinHoldoff, liveness, markMask, cniMarks and cniConfDir
// are the flags of those names, when given.
var (
	flapDamping *agent.FlapDamping
	joinHoldoff *metav1.Duration
	liveness    *agent.Liveness
	markMask    *uint32
	cniMarks    *uint32
	cniConfDir  string
)

// withFlags applies the flags that override a settings file.
func withFlags(s agent.Settings) agent.Settings {
	if flapDamping != nil {
		s.FlapDamping = *flapDamping
	}
	if joinHoldoff != nil {
		s.JoinHoldoff = joinHoldoff
	}
	if liveness != nil {
		s.Liveness = *liveness
	}
	if markMask != nil {
		s.MarkMask = *markMask
	}
	if cniMarks != nil {
		s.CNIMarks = cniMarks
	}
	if cniConfDir != "" {
		s.CNIConfDir = cniConfDir
	}
	return s
}

func main() {
	configPath := flag.String("config", "", "the node's settings file (YAML): node name, pin and state directories, tables, mark mask, observe-only")
	nodeStatePath := flag.String("node-state", "", "file mode: the node's MPTCPNodeState (YAML), what to enforce")
	peersPath := flag.String("peers", "", "file mode: the cluster's MPTCPPeers (YAML list), what liveness probes; none: no peers")
	uninstall := flag.Bool("uninstall", false, "remove every program, map, pin, rule, table and setting the agent created, then exit")
	logLevel := flag.String("log-level", "info", "debug, info, warn or error")
	metricsAddr := flag.String("metrics-addr", observe.DefaultMetricsAddr, "address serving /metrics, /healthz and /readyz (port 0 picks a free port, recorded in status.json); 0 disables them")
	flag.BoolVar(&metricsServing.auth, "metrics-auth", false, "kube mode: serve over TLS, and /metrics only to callers the API server authenticates and authorizes (get on the non-resource URL /metrics)")
	flag.StringVar(&metricsServing.certDir, "metrics-cert-dir", "", "with -metrics-auth: directory holding tls.crt and tls.key (reloaded when they change); empty: a self-signed certificate")
	// controller-runtime registers -kubeconfig itself (pkg/client/config);
	// the agent reads that flag rather than defining a second one.
	if flag.Lookup("kubeconfig") == nil {
		flag.String("kubeconfig", "", "")
	}
	flag.Lookup("kubeconfig").Usage = "kube mode: kubeconfig of the API server (\"in-cluster\" for the pod's service account)"
	node := flag.String("node", "", "kube mode: this node's name (its MPTCPNodeState)")
	daemonSet := flag.String("daemonset", "", "kube mode: NAMESPACE/NAME of the DaemonSet the agent runs under; when it is deleted, a stopping agent uninstalls")
	flag.Func("flap-damping", "hold a path NIC that keeps losing its carrier down: TRANSITIONS/WINDOW/HOLD (e.g. 3/1m/10s: three losses within a minute hold its paths down until it has been back 10 s) or off; overrides the settings file", func(v string) error {
		f, err := agent.ParseFlapDamping(v)
		flapDamping = &f
		return err
	})
	flag.Func("join-holdoff", "userspace mode: how long a join the agent opens stays a backup subflow after it is established, against a kernel defect that changes data a join receives too early (docs/subflows.md); 0 opens joins active; overrides the settings file", func(v string) error {
		d, err := agent.ParseJoinHoldoff(v)
		joinHoldoff = &metav1.Duration{Duration: d}
		return err
	})
	flag.Func("liveness", "probe each path to each peer node: PORT/INTERVAL/MULTIPLIER[/IDLE] (e.g. 7471/30ms/5/2s: a probe every 30 ms to a peer the node's pods send to and every 2 s to the others, from and to UDP port 7471; a peer silent for 5 of its intervals is down on the path) or off; overrides the settings file", func(v string) error {
		l, err := agent.ParseLiveness(v)
		liveness = &l
		return err
	})
	flag.Func("mark-mask", "the skb->mark bits that carry the path: 4 or more contiguous bits the CNI and kube-proxy leave free (default 0x00f00000); overrides the settings file", func(v string) error {
		m, err := cni.ParseMarks(v)
		markMask = &m
		return err
	})
	flag.Func("cni-marks", "the skb->mark bits the node's CNI uses, when not the defaults the agent knows for it (e.g. Calico's FELIX_IPTABLESMARKMASK); the agent enforces nothing while they share a bit with the mark mask; overrides the settings file", func(v string) error {
		m, err := cni.ParseMarks(v)
		cniMarks = &m
		return err
	})
	flag.StringVar(&cniConfDir, "cni-conf-dir", "", "where the node's container runtime reads its CNI configuration (default /etc/cni/net.d); overrides the settings file")
	flag.StringVar(&netnsutil.ProcSys, "proc-sys", netnsutil.ProcSys, "directory whose net/ is a writable /proc/sys/net (in a container: a mount of the host's, e.g. /host/proc/sys)")
	installPreload := flag.String("install-preload", "", "write the preload library ("+preload.Library+") into this directory and exit: the init container that podMPTCP.transparent inject adds to a pod")
	localAPIGet := flag.String("local-api-get", "", "send GET PATH to the running agent's local API (e.g. /v1/pods/NAMESPACE/NAME), print the answer and exit; with -node, or -config, naming the agent's node: what `kubectl mptcp` runs in the agent's container")
	showVersion := flag.Bool("version", false, "print the build (version, source revision, Go version) and exit")
	flag.Parse()

	if *showVersion {
		fmt.Println(buildinfo.String())
		return
	}

	if *installPreload != "" {
		path, err := preload.Install(*installPreload)
		if err != nil {
			fmt.Fprintf(os.Stderr, "agent: installing the preload library: %v\n", err)
			os.Exit(1)
		}
		fmt.Println(path)
		return
	}

	if *localAPIGet != "" {
		if err := queryLocalAPI(*configPath, *node, *localAPIGet); err != nil {
			fmt.Fprintf(os.Stderr, "agent: %v\n", err)
			os.Exit(1)
		}
		return
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "bad -log-level: %v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	log.Info("mptcp-operator agent", "version", buildinfo.Version(), "revision", buildinfo.Revision())
	kubeconfig := flag.Lookup("kubeconfig").Value.String()
	if kubeconfig != "" || *node != "" {
		if kubeconfig == "" || *node == "" {
			fmt.Fprintln(os.Stderr, "agent: kube mode needs both -kubeconfig and -node")
			os.Exit(2)
		}
		if err := runKube(log, kubeOptions{kubeconfig: kubeconfig, node: *node, configPath: *configPath, metricsAddr: *metricsAddr,
			daemonSet: *daemonSet, uninstall: *uninstall}); err != nil {
			log.Error("agent stopped", "err", err)
			os.Exit(1)
		}
		return
	}
	if *configPath == "" {
		fmt.Fprintln(os.Stderr, "agent: -config (or -kubeconfig and -node) is required")
		os.Exit(2)
	}
	if metricsServing.auth {
		fmt.Fprintln(os.Stderr, "agent: -metrics-auth needs kube mode (-kubeconfig and -node): the API server reviews the scrapers")
		os.Exit(2)
	}
	if err := run(log, *configPath, *nodeStatePath, *peersPath, *metricsAddr, *uninstall); err != nil {
		log.Error("agent stopped", "err", err)
		os.Exit(1)
	}
}

// queryLocalAPI prints the local API's answer to GET path of the agent of
// the node that -config or -node names.
func queryLocalAPI(configPath, node, path string) error {
	var settings agent.Settings
	switch {
	case configPath != "":
		s, err := agent.LoadSettings(configPath)
		if err != nil {
			return err
		}
		settings = s
	case node != "":
		settings = agent.NodeDefaults(node)
	default:
		return errors.New("-local-api-get needs -node or -config: the state directory holding the agent's socket is the node's")
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	return observe.LocalAPIGet(ctx, settings.StateDir, path, os.Stdout)
}

func run(log *slog.Logger, configPath, nodeStatePath, peersPath, metricsAddr string, uninstall bool) error {
	settings, err := agent.LoadSettings(configPath)
	if err != nil {
		return err
	}
	settings = withFlags(settings)
	log = log.With("node", settings.Node)
	a, unlock, err := openAgent(log, settings, nil)
	if err != nil {
		return err
	}
	defer unlock()
	if uninstall {
		return uninstallAgent(a, log)
	}
	defer a.Close()
	if nodeStatePath == "" {
		return errors.New("-node-state is required (the node's MPTCPNodeState, as YAML)")
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	s, done, err := serve(log, a, metricsAddr, nil)
	// Stop serving before the datapath is closed (deferred earlier).
	defer done()
	if err != nil {
		return err
	}
	f := &fileMode{serving: s, a: a, log: log, configPath: configPath, nodeStatePath: nodeStatePath, peersPath: peersPath}
	if err := f.reconcile(); err != nil {
		return err
	}
	return f.loop(hup)
}

// fileMode enforces the node state of files, read again at each reconcile.
type fileMode struct {
	*serving
	a                                    *agent.Agent
	log                                  *slog.Logger
	configPath, nodeStatePath, peersPath string
}

// reconcile reads both files again and enforces the plan they make; a
// node state that cannot be enforced as a whole is refused and the
// last good plan stays in force. A map migration New started is settled
// by the outcome (Agent.FinishMigration) before the status is written,
// so that a status showing the reconcile shows its outcome; a rolled back
// migration is returned, the agent's end; other errors are reported and
// the loop goes on.
func (f *fileMode) reconcile() (fatal error) {
	f.status.Reconciles++
	var plan *agent.Plan
	var problems []string
	prior, err := f.a.Prior()
	if err == nil {
		plan, problems, err = agent.PlanFromFiles(f.configPath, f.nodeStatePath, f.peersPath, prior)
	}
	if err == nil {
		f.metrics.ObservePeers(plan.ProbedPeers, len(plan.UnprobedPeers))
		start := time.Now()
		var failed []mptcpv1alpha1.PodProblem
		failed, err = f.a.Reconcile(f.ctx, plan)
		f.metrics.ObserveReconcile(start, err)
		// Pods the agent could not configure are skipped and
		// reported as the translation's are.
		for _, p := range failed {
			problems = append(problems, agent.DescribePodProblem(p))
		}
	} else {
		f.metrics.ObserveRejected()
	}
	if fatal = f.a.FinishMigration(err); fatal != nil {
		err = fatal
	}
	switch {
	case err != nil:
		f.status.Error = err.Error()
		f.log.Error("node state not enforced; the last good one stays in force", "err", err)
	default:
		// Paths this node cannot carry are left out and reported;
		// the rest is enforced.
		f.status.Error = strings.Join(problems, "; ")
		f.status.Applied = plan
		f.log.Info("reconciled", "paths", len(plan.Paths), "pods", len(plan.Pods), "problems", problems)
	}
	if err := f.a.WriteStatus(f.status); err != nil {
		f.log.Error("writing status", "err", err)
	}
	return fatal
}

// loop reconciles again on SIGHUP and after a link or liveness change, and
// sweeps closed subflows' records, until SIGTERM or SIGINT.
func (f *fileMode) loop(hup <-chan os.Signal) error {
	// Subflows close at any time, not only when the node state
	// changes: sweep their records (released pods', and selected pods'
	// closed ones) as often as kube mode resyncs.
	sweep := time.NewTicker(agent.SweepInterval)
	defer sweep.Stop()
	// A path NIC's link changed: the datapath knows at once
	// (Agent.WatchLinks); a reconcile follows (one pending at most).
	relink := make(chan struct{}, 1)
	reconcileSoon := func() {
		select {
		case relink <- struct{}{}:
		default:
		}
	}
	go f.a.WatchLinks(f.ctx, reconcileSoon)
	// A path's liveness changed: the datapath has it already; the
	// reconcile that follows brings the rest of the node in line, as
	// after a link event.
	f.a.OnLivenessChange(reconcileSoon)
	for {
		select {
		case <-f.ctx.Done():
			f.log.Info("stopping; the datapath stays pinned and keeps steering")
			return nil
		case <-sweep.C:
			if err := f.a.Sweep(); err != nil {
				f.log.Error("sweeping closed subflows' records", "err", err)
			}
		case <-hup:
			if err := f.reconcile(); err != nil {
				return err
			}
		case <-relink:
			if err := f.reconcile(); err != nil {
				return err
			}
		}
	}
}
