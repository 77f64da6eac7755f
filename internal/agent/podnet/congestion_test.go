package podnet

import (
	"slices"
	"strings"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// TestMachineWide holds the tests that change what every bed on the
// machine shares; make test runs them alone, when no bed holds the
// machine's list of allowed congestion controls widened.
func TestMachineWide(t *testing.T) {
	t.Run("ACongestionControlTheNodeHasIsAllowedForPodsByAnAgentInTheNodesNamespace", testAllowsCongestionControlNodeWide)
}

// An agent in the node's network namespace (hostNetwork) gives a pod a
// congestion control the kernel has but does not allow namespaces other
// than its own (tcp_allowed_congestion_control) by adding it to that list,
// as an admin would; from any other namespace it cannot, and the pod is
// refused with what to change, its namespace as it was. This process runs
// in the machine's own namespace, the bed's agents in their nodes'.
func testAllowsCongestionControlNodeWide(t *testing.T) {
	allowedPod := Pod{Name: "allowed", NetNS: "/var/run/netns/" + testutil.NetNS(t, "ccok")}
	refusedPod := Pod{Name: "refused", NetNS: "/var/run/netns/" + testutil.NetNS(t, "ccno")}
	agentElsewhere := testutil.NetNS(t, "ccagent")
	release, held := testbed.HoldAllowedCongestionControls()
	defer release()
	if !held {
		testutil.Unavailable(t, "a bed holds the machine's list of allowed congestion controls widened")
	}
	read := func(ns, key string) string {
		t.Helper()
		v, err := netnsutil.ReadSysctl(ns, key)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	original := read("", allowedCongestionControls)
	t.Cleanup(func() {
		if err := netnsutil.WriteSysctl("", allowedCongestionControls, original); err != nil {
			t.Errorf("putting the machine's list back to %q: %v", original, err)
		}
	})
	available := strings.Fields(read("", "net.ipv4.tcp_available_congestion_control"))
	i := slices.IndexFunc(available, func(n string) bool { return !slices.Contains(strings.Fields(original), n) })
	if i < 0 {
		testutil.Unavailable(t, "the kernel allows every congestion control it has (%v): none to add", available)
	}
	name := available[i]
	inherited := read(refusedPod.NetNS, "net.ipv4.tcp_congestion_control")
	t.Logf("the machine allows %q; adding %s; pods inherit %s", original, name, inherited)

	var refused error
	testutil.InNetNS(t, agentElsewhere, func() { refused = setCongestionControl(refusedPod, name) })
	if refused == nil || !strings.Contains(refused.Error(), "the agent cannot add it") {
		t.Errorf("an agent outside the node's namespace set %s: %v; want it refused, saying the agent cannot add it", name, refused)
	}
	if got := read(refusedPod.NetNS, "net.ipv4.tcp_congestion_control"); got != inherited {
		t.Errorf("the refused pod runs %s, want what it had, %s", got, inherited)
	}
	if got := read("", allowedCongestionControls); got != original {
		t.Errorf("an agent outside the node's namespace changed the machine's list to %q", got)
	}

	if err := setCongestionControl(allowedPod, name); err != nil {
		t.Fatalf("an agent in the node's namespace: %v", err)
	}
	if got := read(allowedPod.NetNS, "net.ipv4.tcp_congestion_control"); got != name {
		t.Errorf("the pod runs %s, want %s", got, name)
	}
	if got := strings.Fields(read("", allowedCongestionControls)); !slices.Equal(got, append(strings.Fields(original), name)) {
		t.Errorf("the machine's list is %v, want %q and %s", got, original, name)
	}
}
