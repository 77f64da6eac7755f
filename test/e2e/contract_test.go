package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// The tests of this file hold the contract from CRD to datapath:
// identities that never move, one set of limits, every field acting.

// sampledTransfer runs one MPTCP connection from pod (1,1) to pod (2,1) for
// d while during runs, and returns the bytes the server received in each
// 250 ms from the connection's first byte, and when the sender started.
// The transfer is checked byte by byte; a failure fails the test with the
// evidence (testbed.Watch).
func sampledTransfer(t *testing.T, bed *testbed.Bed, port int, d time.Duration, during func(start time.Time)) []int64 {
	t.Helper()
	ctx := background(t)
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	defer w.Close()
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, port, true, "-warmup", "0s", "-window", d.String(), "-sample", sampleEvery.String())
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		sent []testbed.SenderReport
		err  error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		sent, err := bed.Send(ctx, bins.Traffic, client, netip.AddrPortFrom(server.Addr, uint16(port)), true,
			"-conns", "1", "-duration", d.String(), "-seed", fmt.Sprint(port))
		done <- result{sent, err}
	}()
	during(start)
	r := <-done
	rep := finishTransfer(t, w, srv, r.sent, r.err)[r.sent[0].Local]
	return rep.Samples
}

const sampleEvery = 250 * time.Millisecond

// rateOver is the rate in bit/s the samples show over [from, to) after the
// first byte.
func rateOver(samples []int64, from, to time.Duration) float64 {
	var bytes int64
	first, last := int(from/sampleEvery), int(to/sampleEvery)
	for i := first; i < last && i < len(samples); i++ {
		bytes += samples[i]
	}
	n := min(last, len(samples)) - first
	if n <= 0 {
		return 0
	}
	return float64(bytes) * 8 / (float64(n) * sampleEvery.Seconds())
}

// A connection keeps the rule it started under while other policies come
// and go: a live connection policed at 30 Mbit/s keeps its cap while a
// policy whose name sorts first, and which caps nothing, is added to its
// pods and removed again. (On a933a17 rules were numbered by their place
// in the sorted list, so the newcomer took the live connection's rule id
// and the connection ran uncapped at the links' 190 Mbit/s.)
func testLiveConnectionKeepsItsCapWhileAPolicySortingFirstComesAndGoes(t *testing.T) {
	kb := startKubeBed(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	bed, c, ctx := kb.bed, kb.env.Client, background(t)
	const capBps = 30_000_000
	capped := &mptcpv1alpha1.MPTCPPolicy{}
	applyObject(t, c, capped, `{"apiVersion":"mptcp.io/v1alpha1","kind":"MPTCPPolicy","metadata":{"name":"spread-fabrics"},
		"spec":{"priority":10,"namespaceSelector":{"matchLabels":{"mptcp.io/tenant":"enabled"}},
		"spread":{"paths":[{"name":"fabric-a"},{"name":"fabric-b"}]},"rateLimits":{"mode":"police","perConnection":"30M"}}}`)
	cappedApplied := mptcpv1alpha1.AppliedPolicy{Name: "spread-fabrics", Generation: capped.Generation}
	for _, n := range bed.Nodes {
		kb.waitState(t, n, "applying the capped policy", settled(metav1.ConditionFalse, cappedApplied))
	}

	var added, removed time.Duration
	samples := sampledTransfer(t, bed, 5301, 14*time.Second, func(start time.Time) {
		time.Sleep(4 * time.Second)
		first := &mptcpv1alpha1.MPTCPPolicy{}
		applyObject(t, c, first, `{"apiVersion":"mptcp.io/v1alpha1","kind":"MPTCPPolicy","metadata":{"name":"aaa-first"},
			"spec":{"priority":0,"namespaceSelector":{"matchLabels":{"mptcp.io/tenant":"enabled"}},
			"spread":{"paths":[{"name":"fabric-b"},{"name":"fabric-a"}]}}}`)
		for _, n := range bed.Nodes {
			kb.waitState(t, n, "applying the policy sorting first", settled(metav1.ConditionFalse,
				mptcpv1alpha1.AppliedPolicy{Name: "aaa-first", Generation: first.Generation}, cappedApplied))
		}
		added = time.Since(start)
		time.Sleep(4 * time.Second)
		if err := c.Delete(ctx, first); err != nil {
			t.Error(err)
			return
		}
		for _, n := range bed.Nodes {
			kb.waitState(t, n, "removing the policy sorting first", settled(metav1.ConditionFalse, cappedApplied))
		}
		removed = time.Since(start)
	})
	phases := []struct {
		name     string
		from, to time.Duration
	}{
		{"before", time.Second, 4 * time.Second},
		{"with a policy sorting first", added + 500*time.Millisecond, added + 3500*time.Millisecond},
		{"after it was removed", removed + 500*time.Millisecond, 13 * time.Second},
	}
	for _, p := range phases {
		r := rateOver(samples, p.from, p.to)
		t.Logf("%s (%.1f s to %.1f s): %.1f Mbit/s, cap %d Mbit/s", p.name, p.from.Seconds(), p.to.Seconds(), r/1e6, capBps/1_000_000)
		// Police lets a cubic or bbr sender reach 0.75..1.0 of the cap
		// (TestRate/PoliceCapsWhatThePodSends); uncapped, two 100 Mbit/s
		// links give it six times as much.
		if r > 1.5*capBps || r < 0.3*capBps {
			t.Errorf("%s: the live connection ran at %.1f Mbit/s, want its 30 Mbit/s cap held", p.name, r/1e6)
		}
	}
}

// setPaths changes the example paths as an admin would (kubectl edit).
func (kb *kubeBed) setPaths(t *testing.T, edit func(*mptcpv1alpha1.MPTCPPathSpec)) {
	t.Helper()
	for _, name := range []string{"fabric-a", "fabric-b"} {
		var p mptcpv1alpha1.MPTCPPath
		if err := kb.env.Client.Get(context.Background(), types.NamespacedName{Name: name}, &p); err != nil {
			t.Fatal(err)
		}
		edit(&p.Spec)
		if err := kb.env.Client.Update(context.Background(), &p); err != nil {
			t.Fatal(err)
		}
	}
}

// A path's capacity bounds the shaping on its NIC: a policy shaping each
// pod at 150 Mbit/s (its class on the shaping device, for both paths), over
// two paths of 20 Mbit/s capacity on 200 Mbit/s links, holds a pod's
// connection to the 40 Mbit/s the two paths carry: what the device gives
// back to each NIC passes under the path's capacity. (On a933a17 capacity was copied and never read: the pod sent
// at the links' rate.)
func testPathCapacityBoundsShapingOnItsNIC(t *testing.T) {
	kb := startKubeBed(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit"})
	bed, c := kb.bed, kb.env.Client
	kb.setPaths(t, func(s *mptcpv1alpha1.MPTCPPathSpec) { s.Capacity = resource.MustParse("20M") })
	pol := &mptcpv1alpha1.MPTCPPolicy{}
	applyObject(t, c, pol, `{"apiVersion":"mptcp.io/v1alpha1","kind":"MPTCPPolicy","metadata":{"name":"shaped"},
		"spec":{"namespaceSelector":{"matchLabels":{"mptcp.io/tenant":"enabled"}},
		"spread":{"paths":[{"name":"fabric-a"},{"name":"fabric-b"}]},"rateLimits":{"mode":"shape","perPod":"150M"}}}`)
	for _, n := range bed.Nodes {
		s := kb.waitState(t, n, "applying the shaping policy", settled(metav1.ConditionFalse, mptcpv1alpha1.AppliedPolicy{Name: "shaped", Generation: pol.Generation}))
		for _, p := range s.Spec.Paths {
			if p.Capacity.Cmp(resource.MustParse("20M")) != 0 {
				t.Fatalf("node %d: path %s has capacity %s in its state, want 20M", n.Index, p.Name, p.Capacity.String())
			}
		}
	}
	const capacity = 2 * 20_000_000
	r := transfer(t, bed, 5311, "cubic")
	t.Logf("goodput %.1f Mbit/s; the two paths' capacity %d Mbit/s, the policy's cap 150 Mbit/s", r.goodput/1e6, capacity/1_000_000)
	if r.goodput > 1.1*capacity || r.goodput < 0.6*capacity {
		t.Errorf("the pod sent at %.1f Mbit/s, want within the paths' %d Mbit/s", r.goodput/1e6, capacity/1_000_000)
	}
}

// A path whose defaultRole is backup is a backup path in a policy that
// lists it in its spread without a role of its own (and allows header
// rewriting, which flagging needs): the client pod's join on it is held as
// backup by the pod's kernel, and it carries almost nothing while the
// active path is up. (On a933a17 defaultRole was copied and never read.)
func testDefaultRoleBackupMakesAPathBackupWhereAPolicySaysNothing(t *testing.T) {
	kb := startKubeBed(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	bed, c, ctx := kb.bed, kb.env.Client, background(t)
	var fabricB mptcpv1alpha1.MPTCPPath
	if err := c.Get(ctx, types.NamespacedName{Name: "fabric-b"}, &fabricB); err != nil {
		t.Fatal(err)
	}
	fabricB.Spec.DefaultRole = mptcpv1alpha1.PathRoleBackup
	if err := c.Update(ctx, &fabricB); err != nil {
		t.Fatal(err)
	}
	pol := &mptcpv1alpha1.MPTCPPolicy{}
	applyObject(t, c, pol, `{"apiVersion":"mptcp.io/v1alpha1","kind":"MPTCPPolicy","metadata":{"name":"spread"},
		"spec":{"namespaceSelector":{"matchLabels":{"mptcp.io/tenant":"enabled"}},"headerRewriting":"Allowed",
		"spread":{"paths":[{"name":"fabric-a"},{"name":"fabric-b"}]}}}`)
	for _, n := range bed.Nodes {
		s := kb.waitState(t, n, "applying the policy", settled(metav1.ConditionFalse, mptcpv1alpha1.AppliedPolicy{Name: "spread", Generation: pol.Generation}))
		if len(s.Spec.Rules) != 1 || len(s.Spec.Rules[0].Paths) != 1 || !slices.Equal(s.Spec.Rules[0].BackupPaths, []string{"fabric-b"}) {
			t.Fatalf("node %d: rules %+v, want fabric-a active and fabric-b backup", n.Index, s.Spec.Rules)
		}
	}
	client := bed.Pod(1, 1)
	_, tx0 := nicBytes(t, bed, bed.Node(1))
	sampledTransfer(t, bed, 5321, 6*time.Second, func(time.Time) {
		time.Sleep(3 * time.Second)
		requireOneBackupSubflow(t, bed, client)
	})
	_, tx1 := nicBytes(t, bed, bed.Node(1))
	active, backup := float64(tx1[0]-tx0[0]), float64(tx1[1]-tx0[1])
	t.Logf("node 1 sent %.1f MB on fabric-a, %.3f MB on fabric-b (%.2f%%)", active/1e6, backup/1e6, 100*backup/(active+backup))
	if backup/(active+backup) >= 0.05 {
		t.Errorf("the backup path carried %.2f%% of the bytes, want under 5%%", 100*backup/(active+backup))
	}
}

// A tenant's preference acts in every spread mode: the initial subflow of
// every connection of a pod annotated mptcp.io/preferred-paths: fabric-b
// leaves by fabric-b's NIC, whether the policy spreads weighted (the
// example's fabric-a:2, fabric-b:1), round robin or preferred-first, while
// the same node's unannotated pod starts connections on fabric-a too. (On
// a933a17 the preference reordered the path list, which only
// preferredFirst reads: in the other modes it changed nothing.)
func testTenantPreferenceActsInEverySpreadMode(t *testing.T) {
	kb := startKubeBed(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 2, LinkRate: "100mbit"})
	bed, c, ctx := kb.bed, kb.env.Client, background(t)
	preferring, plain := bed.Pod(1, 1), bed.Pod(1, 2)
	var pod corev1.Pod
	if err := c.Get(ctx, types.NamespacedName{Namespace: appsNS, Name: preferring.Name}, &pod); err != nil {
		t.Fatal(err)
	}
	pod.Annotations = map[string]string{mptcpv1alpha1.AnnotationPreferredPaths: "fabric-b"}
	if err := c.Update(ctx, &pod); err != nil {
		t.Fatal(err)
	}
	testenv.CreateObjects(t, c, filepath.Join(testenv.RepoRoot(), "examples", "policy-spread.yaml"))
	flows := []flow{
		{client: preferring, server: bed.Pod(2, 1), port: 5331, conns: 3},
		{client: plain, server: bed.Pod(2, 2), port: 5332, conns: 3},
	}
	for _, mode := range []mptcpv1alpha1.SpreadMode{mptcpv1alpha1.SpreadWeighted, mptcpv1alpha1.SpreadRoundRobin, mptcpv1alpha1.SpreadPreferredFirst} {
		t.Run(string(mode), func(t *testing.T) {
			pol := kb.policy(t)
			if pol.Spec.Spread.Mode != mode {
				pol = updatePolicy(t, c, pol.Name, func(p *mptcpv1alpha1.MPTCPPolicy) { p.Spec.Spread.Mode = mode })
			}
			for _, n := range bed.Nodes {
				kb.waitState(t, n, "applying "+string(mode), settled(metav1.ConditionFalse, mptcpv1alpha1.AppliedPolicy{Name: pol.Name, Generation: pol.Generation}))
			}
			analysis, _ := captureFlows(t, bed, flows)
			initial := map[netip.Addr][]int{} // client -> the NIC of each connection's initial subflow
			for _, conn := range analysis.Connections {
				if len(conn.Subflows) == 0 || conn.Subflows[0].Kind != testbed.KindMPCapable {
					continue
				}
				sf := conn.Subflows[0]
				initial[sf.Src.Addr()] = append(initial[sf.Src.Addr()], sf.NICs(1, testbed.Out)...)
			}
			t.Logf("initial subflows leave node 1 by nic %v (annotated pod), %v (unannotated pod)", initial[preferring.Addr], initial[plain.Addr])
			if got := initial[preferring.Addr]; len(got) != 3 || slices.ContainsFunc(got, func(nic int) bool { return nic != 2 }) {
				t.Errorf("%s: the annotated pod's connections started on nics %v, want all three on nic2 (fabric-b)", mode, got)
			}
			if got := initial[plain.Addr]; len(got) != 3 || !slices.Contains(got, 1) {
				t.Errorf("%s: the unannotated pod's connections started on nics %v, want fabric-a (nic1) among them", mode, got)
			}
		})
	}
}

// A changed rule reaches running pods without an agent restart: raising a
// policy's maxSubflows from 2 to 4 over three paths gives the next
// connection of an already configured pod a subflow on each of the three
// (its running path manager opens the joins the rule asks for now). (On
// a933a17 the pod's path manager kept the joins it started with: 2
// subflows until the agent restarted.) TestEveryRuleFieldReachesRunningPods
// (internal/agent) changes every field of a rule this way.
func testRaisedMaxSubflowsReachesRunningPods(t *testing.T) {
	kb := startKubeBed(t, testbed.Config{Nodes: 2, NICs: 3, PodsPerNode: 1, LinkRate: "100mbit"})
	bed, c := kb.bed, kb.env.Client
	applyObject(t, c, &mptcpv1alpha1.MPTCPPath{}, `{"apiVersion":"mptcp.io/v1alpha1","kind":"MPTCPPath","metadata":{"name":"fabric-c"},
		"spec":{"nodeSelector":{"matchLabels":{"mptcp.io/multipath":"true"}},"interface":{"name":"nic3"},"capacity":"10G"}}`)
	pol := &mptcpv1alpha1.MPTCPPolicy{}
	applyObject(t, c, pol, `{"apiVersion":"mptcp.io/v1alpha1","kind":"MPTCPPolicy","metadata":{"name":"spread"},
		"spec":{"namespaceSelector":{"matchLabels":{"mptcp.io/tenant":"enabled"}},"maxSubflows":2,
		"spread":{"mode":"roundRobin","paths":[{"name":"fabric-a"},{"name":"fabric-b"},{"name":"fabric-c"}]}}}`)
	subflows := func(what string, gen int64) []int {
		t.Helper()
		for _, n := range bed.Nodes {
			kb.waitState(t, n, what, func(s *mptcpv1alpha1.MPTCPNodeState) bool {
				// fabric-c gets its index after the policy may
				// have compiled: wait for the rule to name it.
				return settled(metav1.ConditionFalse, mptcpv1alpha1.AppliedPolicy{Name: "spread", Generation: gen})(s) &&
					len(s.Spec.Rules) == 1 && len(s.Spec.Rules[0].Paths) == 3
			})
		}
		analysis, _ := captureFlows(t, bed, []flow{{client: bed.Pod(1, 1), server: bed.Pod(2, 1), port: 5341, conns: 2}})
		var out []int
		for _, conn := range analysis.Connections {
			out = append(out, len(conn.Subflows))
		}
		return out
	}
	if got := subflows("applying maxSubflows 2", pol.Generation); len(got) != 2 || got[0] != 2 || got[1] != 2 {
		t.Fatalf("under maxSubflows 2 the connections have %v subflows, want 2 each", got)
	}
	pol = updatePolicy(t, c, "spread", func(p *mptcpv1alpha1.MPTCPPolicy) { p.Spec.MaxSubflows = 4 })
	if got := subflows("applying maxSubflows 4", pol.Generation); len(got) != 2 || got[0] != 3 || got[1] != 3 {
		t.Errorf("under maxSubflows 4, over three paths, the connections have %v subflows, want 3 each (one per path)", got)
	}
}
