package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/release"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// TestCNI (research, wip/flannel): the chart's operator on real nodes whose
// CNI is a real flannel (test/testbed/nodes Flannel) instead of ptp.
// Skipped unless FLANNELD names a flanneld binary (`make flanneld`).
func TestCNI(t *testing.T) {
	// The bed's fabrics route every pod CIDR (the agent's prerequisite):
	// the agent's path tables then carry selected pods' traffic out of the
	// path NICs unencapsulated, flannel.1 carries none of it, and the
	// captures show the spread.
	t.Run("flannel-vxlan", func(t *testing.T) { testFlannelWithTheAgent(t, "vxlan", true) })
	// A VXLAN underlay as flannel expects it: the fabrics route the nodes'
	// addresses only. The agent's marked packets leave the path NICs
	// unencapsulated as before, and the fabrics have no route for them.
	t.Run("flannel-vxlan-underlay-without-pod-routes", func(t *testing.T) { testFlannelWithTheAgent(t, "vxlan", false) })
}

// testFlannelWithTheAgent: install the chart, apply examples/ (paths nic1
// and nic2, policy-spread), and send MPTCP between tenant pods of the two
// nodes, as the chart's install test does; report what the captures show
// and how much of it crossed flannel.1.
func testFlannelWithTheAgent(t *testing.T, backend string, fabricsRoutePods bool) {
	flanneld := os.Getenv("FLANNELD")
	if flanneld == "" {
		t.Skip("FLANNELD is not set: `make flanneld`, then FLANNELD=$(make -s print-flanneld)")
	}
	start := time.Now()
	cb := startChartBedWith(t, testbed.Config{Nodes: 2, NICs: 2, LinkRate: "100mbit"}, func(o *nodes.Options) {
		o.Flannel = &nodes.Flannel{Flanneld: flanneld, Backend: backend}
	})
	ctx := background(t)
	if !fabricsRoutePods {
		for _, n := range cb.bed.Nodes {
			for _, nic := range n.NICs {
				if out := cmdOut(nic.FabricNS, "ip", "route", "del", n.PodCIDR.String()); out != "" {
					t.Fatal(out)
				}
			}
		}
	}
	cb.namespace(t, tenantNS, tenantLabels)
	if err := nodes.AllowAwait(ctx, cb.c, tenantNS); err != nil {
		t.Fatal(err)
	}
	servers := map[int]*corev1.Pod{}
	for _, n := range cb.bed.Nodes {
		servers[n.Index] = cb.serverPod(n)
		if err := cb.c.Create(ctx, servers[n.Index]); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range cb.bed.Nodes {
		p := cb.attach(t, servers[n.Index])
		t.Logf("server pod %s on %s behind %s", p.Addr, n.NetNS, p.HostIf)
	}
	cb.install(t, release.Chart(), cb.images)
	examples := filepath.Join(testenv.RepoRoot(), "examples")
	if err := cb.cp.ApplyFiles(ctx, filepath.Join(examples, "paths.yaml"), filepath.Join(examples, "policy-spread.yaml")); err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		if err := nodes.WaitStarted(ctx, cb.c, s, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := cb.nodes.WaitListening(ctx, s, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range cb.bed.Nodes {
		t.Logf("%s rules:\n%s", n.NetNS, cmdOut(n.NetNS, "ip", "rule"))
	}
	before := map[string]string{}
	for _, n := range cb.bed.Nodes {
		before[n.NetNS] = linkTX(n.NetNS)
	}
	if !fabricsRoutePods {
		// A short run: whether a connection opens at all within 20 s.
		var clients []*corev1.Pod
		for _, n := range cb.bed.Nodes {
			peer := servers[3-n.Index]
			cl := nodes.TrafficPod(tenantNS, fmt.Sprintf("client%d", n.Index), framework.NodeName(n), cb.images[nodes.TrafficImage].Ref,
				map[string]string{"app": "client"}, []corev1.EnvVar{{Name: "SERVER", Value: fmt.Sprintf("%s:%d", peer.Status.PodIP, tenantPort)}},
				"send", "-to", "$(SERVER)", "-mptcp", "-json", "-conns", "1", "-bytes", "65536", "-seed", fmt.Sprint(n.Index))
			if err := cb.c.Create(ctx, cl); err != nil {
				t.Fatal(err)
			}
			clients = append(clients, cl)
		}
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var failed []string
		for _, cl := range clients {
			err := cb.nodes.WaitEnded(wctx, cb.c, cl)
			t.Logf("client %s to %s: %v; its log: %q", cl.Name, cl.Spec.Containers[len(cl.Spec.Containers)-1].Env, err, cb.nodes.WorkloadLog(cl, ""))
			if err != nil {
				failed = append(failed, cl.Name)
			}
		}
		for _, n := range cb.bed.Nodes {
			t.Logf("%s bytes sent, before the transfers:\n%s\nafter:\n%s", n.NetNS, before[n.NetNS], linkTX(n.NetNS))
		}
		if len(failed) != len(cb.bed.Nodes) {
			t.Errorf("clients failed: %v; want every one to fail, the fabrics having no route to the pods", failed)
		}
		t.Logf("row done in %s", time.Since(start).Round(100*time.Millisecond))
		return
	}
	w := cb.bed.Watch(t, framework.DatapathEvidence(cb.bed))
	const conns = 2
	var clients []*corev1.Pod
	for _, n := range cb.bed.Nodes {
		peer := servers[3-n.Index]
		cl := nodes.TrafficPod(tenantNS, fmt.Sprintf("client%d", n.Index), framework.NodeName(n), cb.images[nodes.TrafficImage].Ref,
			map[string]string{"app": "client"}, []corev1.EnvVar{{Name: "SERVER", Value: fmt.Sprintf("%s:%d", peer.Status.PodIP, tenantPort)}},
			"send", "-to", "$(SERVER)", "-mptcp", "-json", "-conns", fmt.Sprint(conns), "-duration", capturedTransfer.String(), "-seed", fmt.Sprint(n.Index))
		if err := cb.c.Create(ctx, cl); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, cl)
	}
	var sent []testbed.SenderReport
	var got []testbed.ServerReport
	for _, cl := range clients {
		if err := cb.nodes.WaitEnded(ctx, cb.c, cl); err != nil {
			w.Fail(err)
		}
		reps, err := cb.nodes.SenderReports(cl)
		if err != nil {
			w.Fail(err)
		}
		sent = append(sent, reps...)
	}
	for _, s := range servers {
		reps, err := cb.nodes.ServerReports(ctx, s, conns, 30*time.Second)
		if err != nil {
			w.Fail(err)
		}
		got = append(got, reps...)
	}
	w.Match(sent, got)
	for _, n := range cb.bed.Nodes {
		t.Logf("%s bytes sent, before the transfers:\n%s\nafter:\n%s", n.NetNS, before[n.NetNS], linkTX(n.NetNS))
	}
	analysis := analyzeWatched(t, w)
	for _, c := range analysis.Connections {
		t.Logf("connection %08x: %d subflows: %v", c.Token, len(c.Subflows), c.Subflows)
	}
	requireSpread(t, analysis, len(sent), "flannel "+backend)
	t.Logf("row done in %s", time.Since(start).Round(100*time.Millisecond))
}

func cmdOut(ns string, args ...string) string {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// linkTX lists the bytes each of the node's interfaces sent.
func linkTX(ns string) string {
	out := cmdOut(ns, "sh", "-c", `for d in nic1 nic2 flannel.1 cni0; do printf '%s %s\n' $d $(cat /sys/class/net/$d/statistics/tx_bytes 2>/dev/null); done`)
	return out
}
