package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/release"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// previousChartRelease is the release a chart upgrade starts from
// (release.PreviousChart).
const previousChartRelease = release.PreviousChart

// rolloutSample is the agent pods seen at one moment of an upgrade.
type rolloutSample struct {
	at   time.Time
	pods []corev1.Pod
}

// watchAgentPods samples the agent pods every 100 ms until stop, and once
// more when stopped.
func (cb *chartBed) watchAgentPods() (stop func() []rolloutSample) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var samples []rolloutSample
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			var pods corev1.PodList
			err := cb.c.List(ctx, &pods, client.InNamespace(release.Namespace), client.MatchingLabels{"app.kubernetes.io/component": "agent"})
			if err == nil {
				mu.Lock()
				samples = append(samples, rolloutSample{at: time.Now(), pods: pods.Items})
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() []rolloutSample {
		cancel()
		<-done
		// One more, taken after the upgrade returned: helm saw the last
		// agent ready, and a sample from up to 100 ms before may not.
		var pods corev1.PodList
		if err := cb.c.List(context.Background(), &pods, client.InNamespace(release.Namespace), client.MatchingLabels{"app.kubernetes.io/component": "agent"}); err == nil {
			samples = append(samples, rolloutSample{at: time.Now(), pods: pods.Items})
		}
		return samples
	}
}

// agentReady: the pod runs, is not being deleted, and its agent is ready.
func agentReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func agentImage(p *corev1.Pod) string {
	for _, c := range p.Spec.Containers {
		if c.Name == "agent" {
			return c.Image
		}
	}
	return ""
}

// checkRollout checks what the samples of an upgrade to image show: never
// two ready agents on a node (the DaemonSet never surges, and a new agent
// becomes ready only after the old one stopped: it waits for the node's
// lock before it loads anything), never more than one node without a
// ready agent (the nodes' agents replaced one at a time), and every node's
// agent replaced by a ready one of image. It returns each node's
// replacement window.
func checkRollout(samples []rolloutSample, nodeNames []string, image string) ([]string, error) {
	var errs []error
	gone, back := map[string]time.Time{}, map[string]time.Time{}
	for _, s := range samples {
		unavailable := 0
		for _, n := range nodeNames {
			available, ready := false, 0
			var seen []string
			for i := range s.pods {
				p := &s.pods[i]
				if p.Spec.NodeName != n {
					continue
				}
				seen = append(seen, describeAgentPod(p))
				if containerReady(p) {
					ready++
				}
				if agentReady(p) {
					available = true
					if agentImage(p) == image && back[n].IsZero() {
						back[n] = s.at
					}
				}
			}
			if !available {
				unavailable++
				if gone[n].IsZero() {
					gone[n] = s.at
				}
			}
			if ready > 1 {
				errs = append(errs, fmt.Errorf("%s: %d ready agents on %s at once: %s", s.at.Format("15:04:05.000"), ready, n, strings.Join(seen, "; ")))
			}
		}
		if unavailable > 1 {
			errs = append(errs, fmt.Errorf("%s: %d nodes without a ready agent at once", s.at.Format("15:04:05.000"), unavailable))
		}
	}
	var windows []string
	for _, n := range nodeNames {
		if back[n].IsZero() || gone[n].IsZero() {
			errs = append(errs, fmt.Errorf("%s: its agent was not replaced by a ready %s", n, image))
			continue
		}
		windows = append(windows, fmt.Sprintf("%s without a ready agent from %s to %s", n, gone[n].Format("15:04:05.0"), back[n].Format("15:04:05.0")))
	}
	return windows, errors.Join(errs...)
}

// containerReady: the pod's agent container passes its readiness probe,
// whether or not the pod is being deleted.
func containerReady(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == "agent" {
			return cs.Ready
		}
	}
	return false
}

// rolloutSteps lists, per node, each change of its agent pods as the samples
// saw them: where a replacement spends its time.
func rolloutSteps(samples []rolloutSample, nodeNames []string) []string {
	var steps []string
	for _, n := range nodeNames {
		last := ""
		for _, s := range samples {
			var seen []string
			for i := range s.pods {
				if s.pods[i].Spec.NodeName == n {
					seen = append(seen, describeAgentPod(&s.pods[i]))
				}
			}
			if now := strings.Join(seen, "; "); now != last {
				steps = append(steps, fmt.Sprintf("%s %s: %s", s.at.Format("15:04:05.0"), n, now))
				last = now
			}
		}
	}
	return steps
}

func describeAgentPod(p *corev1.Pod) string {
	state := "waiting"
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Running != nil:
			state = fmt.Sprintf("running (ready %v)", cs.Ready)
		case cs.State.Terminated != nil:
			state = "terminated"
		}
	}
	return fmt.Sprintf("%s %s deleting=%v %s", p.Name, agentImage(p), p.DeletionTimestamp != nil, state)
}

// tcxLinks are the TCX link IDs on the ingress of every NIC and bed pod veth
// of the bed, by node and interface: the same IDs after an upgrade mean
// nothing was detached and attached again (a pinned link was updated).
func tcxLinks(t *testing.T, bed *testbed.Bed) map[string][]link.ID {
	t.Helper()
	out := map[string][]link.ID{}
	for _, n := range bed.Nodes {
		ifaces := []string{}
		for _, nic := range n.NICs {
			ifaces = append(ifaces, nic.Name)
		}
		for _, p := range n.Pods {
			ifaces = append(ifaces, p.HostIf)
		}
		for _, i := range ifaces {
			ids, err := framework.TCXIngressLinks(n, i)
			if err != nil {
				t.Fatal(err)
			}
			out[framework.NodeName(n)+" "+i] = ids
		}
	}
	return out
}

// helm upgrade, from the previous release's chart and images built from its
// source to this tree's, while long MPTCP transfers run between pods of two
// nodes. The agents are replaced one node at a time, never two on a node;
// the new agents adopt what the old ones pinned (the same TCX links, every
// subflow on the path and in the role it had); both NICs of the sending node
// keep carrying the transfer through it; no connection is reset and every
// stream arrives as it was sent. Afterwards new connections are spread by
// the new agents, and helm uninstall takes everything away.
func testHelmUpgradeUnderTrafficReplacesAgentsOneNodeAtATime(t *testing.T) {
	builder := testutil.BuiltTool(t, "IMAGEBUILD", "imagebuild")
	start := time.Now()
	prevChart, prevImagesDir, err := framework.BuildChartRelease(t.TempDir(), previousChartRelease, builder, "release-"+previousChartRelease)
	if errors.Is(err, framework.ErrNoHistory) {
		testbed.Unavailable(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	prevImages, err := nodes.ReadImages(prevImagesDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("chart and images of %s built in %s", previousChartRelease, time.Since(start).Round(100*time.Millisecond))
	cb := startChartBed(t, testbed.Config{Nodes: 2, NICs: 2, LinkRate: "50mbit"}, prevImages.All()...)
	bed, ctx := cb.bed, background(t)
	cb.workloadPods(t, appsNS, tenantLabels, 1)
	cb.install(t, prevChart, prevImages)
	examples := filepath.Join(testenv.RepoRoot(), "examples")
	if err := cb.cp.ApplyFiles(ctx, filepath.Join(examples, "paths.yaml"), filepath.Join(examples, "policy-spread.yaml")); err != nil {
		t.Fatal(err)
	}
	kb := &kubeBed{chartBed: cb, env: cb.cp.Env, agents: cb.agents()}
	pol := kb.policy(t)
	applied := mptcpv1alpha1.AppliedPolicy{Name: pol.Name, Generation: pol.Generation}
	for _, n := range bed.Nodes {
		kb.waitState(t, n, "applying the policy", settled(metav1.ConditionFalse, applied))
	}
	agents := kb.agents
	links := tcxLinks(t, bed)

	// The transfer outlasts the upgrade (from the previous release, with
	// readiness probed every 2 s: agents replaced in 9 s, 2026-11-28; an
	// end after the captures' fails the test below rather than watching too
	// little);
	// the captures end while the senders still send, as a connection's
	// teardown may end with a bare RST answering a late segment, which is
	// no reset of a running one.
	const transfer, captured = 30 * time.Second, 27 * time.Second
	const conns = 2
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	began := time.Now()
	wait := launchFlows(t, bed, []flow{{client: client, server: server, port: 5201, conns: conns}}, transfer)
	waitPlaced(t, bed, agents[0], client, 2*conns)
	before := map[*framework.Agent][]datapath.Subflow{}
	for _, a := range agents {
		if before[a], err = a.Subflows(); err != nil {
			t.Fatal(err)
		}
	}

	// The upgrade, as docs/install.md says: the new CRDs (kubectl apply
	// --server-side --force-conflicts), then the chart, with the new
	// chart's defaults and the release's own values
	// (--reset-then-reuse-values).
	crds, _ := filepath.Glob(filepath.Join(release.Chart(), "crds", "*.yaml"))
	if err := cb.cp.ServerSideApply(ctx, true, crds...); err != nil {
		t.Fatal(err)
	}
	newArgs, err := release.ImageValues(cb.images)
	if err != nil {
		t.Fatal(err)
	}
	newArgs = append(newArgs, "--reset-then-reuse-values")
	_, tx0 := nicBytes(t, bed, bed.Node(1))
	rollout := cb.watchAgentPods()
	upgradeStart := time.Now()
	out, err := cb.helm.Upgrade(ctx, release.Chart(), newArgs...)
	samples := rollout()
	if err != nil {
		cb.logAgents(t)
		t.Fatalf("%v\n%s", err, out)
	}
	upgraded := time.Since(upgradeStart)
	_, tx1 := nicBytes(t, bed, bed.Node(1))
	t.Logf("helm upgrade from %s: agents replaced and ready in %s, %s into the transfer", previousChartRelease, upgraded.Round(100*time.Millisecond), time.Since(began).Round(100*time.Millisecond))
	if time.Since(began) > captured-time.Second {
		t.Fatalf("the upgrade ended %v into the transfer: too little of it is left to watch", time.Since(began))
	}
	nodeNames := []string{framework.NodeName(bed.Node(1)), framework.NodeName(bed.Node(2))}
	windows, err := checkRollout(samples, nodeNames, cb.images[release.AgentImage].Ref)
	t.Logf("rollout: %s", strings.Join(windows, "; "))
	if err != nil {
		t.Errorf("the agents' rollout:\n%v", err)
	}
	t.Logf("the agent pods, as they changed:\n%s", strings.Join(rolloutSteps(samples, nodeNames), "\n"))
	for k := range tx0 {
		// 50 Mbit/s is 6.25 MB a second, which the transfer has alone; a
		// quarter of it means the NIC kept carrying its subflows.
		if sent, least := tx1[k]-tx0[k], uint64(upgraded.Seconds()*1.5e6); sent < least {
			t.Errorf("nic%d of node 1 sent %d bytes in the %v of the upgrade, want at least %d", k+1, sent, upgraded, least)
		}
	}
	for _, a := range agents {
		requireSubflowsKept(t, a, before[a])
	}
	if after := tcxLinks(t, bed); !equalLinks(links, after) {
		t.Errorf("TCX links before the upgrade %v, after %v: the new agents attached anew instead of adopting the pinned links", links, after)
	}

	time.Sleep(time.Until(began.Add(captured)))
	files, err := w.Captures()
	if err != nil {
		t.Fatal(err)
	}
	resets, err := framework.UnexpectedResets(t, files)
	if err != nil {
		t.Fatal(err)
	}
	if len(resets) != 0 {
		t.Errorf("%d resets in the captures of the upgrade:\n%s", len(resets), strings.Join(resets, "\n"))
	}
	if n, err := wait(); err != nil {
		w.Fail(err)
	} else if n != conns {
		t.Errorf("%d connections completed, want %d", n, conns)
	}
	w.Close()

	// The new agents steer what comes next.
	for _, n := range bed.Nodes {
		kb.waitState(t, n, "applied by the new agent", settled(metav1.ConditionFalse, applied))
	}
	analysis, n := captureFlows(t, bed, []flow{{client: client, server: server, port: 5202, conns: 2}})
	requireSpread(t, analysis, n, "after the upgrade")
}

func equalLinks(a, b map[string][]link.ID) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}
