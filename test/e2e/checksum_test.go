package e2e

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// A policy keeps DSS checksums on in its pods by default
// (podMPTCP.dataChecksums; examples/policy-spread.yaml says nothing of
// them). Then a wire that changes a byte of a segment without fixing its
// checksum (nothing below MPTCP checks it between namespaces) no longer
// changes the stream: the receiving pod's kernel catches it, resets the
// subflow that carried it and the data arrives over the other; the
// receiving node's agent counts the error for that pod. Setting the field
// to false turns checksums off in the running pods.
func testDataChecksumsCatchWhatAWireChanged(t *testing.T) {
	kb := startKubeBed(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit"})
	bed, c := kb.bed, kb.env.Client
	testenv.CreateObjects(t, c, filepath.Join(testenv.RepoRoot(), "examples", "policy-spread.yaml"))
	pol := kb.policy(t)
	for _, n := range bed.Nodes {
		kb.waitState(t, n, "applying the policy", settled(metav1.ConditionFalse, mptcpv1alpha1.AppliedPolicy{Name: pol.Name, Generation: pol.Generation}))
	}
	client1, server := bed.Pod(1, 1), bed.Pod(2, 1)
	for _, p := range []*testbed.Pod{client1, server} {
		if v := podSysctl(t, p, "net.mptcp.checksum_enabled"); v != "1" {
			t.Fatalf("%s: net.mptcp.checksum_enabled = %s under the policy, want 1 (the default)", p, v)
		}
	}

	// Late enough that the agent has opened the joins: while a connection
	// has a single subflow, a caught change makes it fall back to TCP.
	if err := bed.CorruptSegment(1, 1, 500); err != nil {
		t.Fatal(err)
	}
	ctx := background(t)
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, 5601, true)
	if err != nil {
		t.Fatal(err)
	}
	sent, sendErr := bed.Send(ctx, bins.Traffic, client1, netip.AddrPortFrom(server.Addr, 5601), true, "-bytes", "40000000")
	finishTransfer(t, w, srv, sent, sendErr)
	w.Close()

	metric := "mptcp_agent_pod_mptcp_data_checksum_errors_total"
	if v, ok := scrape(t, kb.agents[1]).Value(metric, "namespace", appsNS, "pod", server.Name); !ok || v < 1 {
		t.Errorf("node 2's agent reports %s{namespace=%q,pod=%q} = %v (present %v), want the changed segment's error", metric, appsNS, server.Name, v, ok)
	}
	if v, _ := bed.KernelCounter(server.NetNS, "MPTcpExtMPRstTx"); v < 1 {
		t.Errorf("the receiving pod reset %v subflows, want the one that carried the change", v)
	}

	if err := c.Patch(ctx, pol, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"podMPTCP":{"dataChecksums":false}}}`))); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range []*testbed.Pod{client1, server} {
		for podSysctl(t, p, "net.mptcp.checksum_enabled") != "0" {
			if time.Now().After(deadline) {
				t.Fatalf("%s: checksums still on 30 s after the policy turned them off", p)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// podSysctl reads a sysctl in a bed pod's network namespace.
func podSysctl(t *testing.T, p *testbed.Pod, key string) string {
	t.Helper()
	v, err := netnsutil.ReadSysctl("/var/run/netns/"+p.NetNS, key)
	if err != nil {
		t.Fatal(fmt.Errorf("%s: %w", p, err))
	}
	return strings.TrimSpace(v)
}
