package compile

import (
	"net/netip"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// A node whose Node had no pod CIDRs may set them itself. What it claims
// reaches its peers only if it is a node's pod range that no other node
// claims: a claim of another node's range, or of a range holding it, is
// dropped for both (which one is honest cannot be told), and so is one
// that does not parse or is wider than a node's range, and one that holds
// an address another node's state lists.
func TestPeersGetOnlyPodCIDRsNoOtherNodeClaims(t *testing.T) {
	withCIDRs := func(name string, cidrs ...string) mptcpv1alpha1.MPTCPNodeState {
		return mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: mptcpv1alpha1.MPTCPNodeStateSpec{PodCIDRs: cidrs}}
	}
	withPods := func(st mptcpv1alpha1.MPTCPNodeState, ips ...string) mptcpv1alpha1.MPTCPNodeState {
		st.Spec.Pods = append(st.Spec.Pods, mptcpv1alpha1.NodePod{Name: "p", IPs: ips})
		return st
	}
	withPaths := func(name string, addrs ...string) mptcpv1alpha1.MPTCPNodeState {
		st := withCIDRs(name)
		st.Spec.Paths = []mptcpv1alpha1.NodePath{{Name: "a", Addresses: addrs}}
		return st
	}
	got := peerPodCIDRs([]mptcpv1alpha1.MPTCPNodeState{
		withCIDRs("n1", "10.244.1.0/24", "fd00:1::/64"),
		withCIDRs("n2", "10.244.2.7/24"), // host bits: masked
		withCIDRs("n3", "10.244.3.0/24"),
		withCIDRs("evil-nested", "10.244.3.128/25"),      // inside n3's
		withCIDRs("evil-wide", "10.245.0.0/16", "::/0"),  // holds n5's; far too wide
		withCIDRs("n5", "10.245.7.0/24"),                 // inside evil-wide's
		withCIDRs("evil-all", "0.0.0.0/0"),               // wider than any node's
		withCIDRs("bad", "010.244.9.0/24", "10.244.9.0"), // neither parses here
		withCIDRs("n6", "10.244.6.0/24", "fd00:6::/64", "10.244.16.0/24"),
		// The whole pool, in a cluster where the other nodes declare
		// none: it holds n7's and n8's pods, and n8's path address.
		withCIDRs("evil-pool", "10.96.0.0/16"),
		withPods(withCIDRs("n7"), "10.96.7.10"),
		withPaths("n8", "10.96.200.8"),
		// Its own pods only: kept.
		withPods(withCIDRs("n9", "10.97.9.0/24"), "10.97.9.10"),
	})
	want := map[string][]netip.Prefix{
		"n1": {netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:1::/64")},
		"n2": {netip.MustParsePrefix("10.244.2.0/24")},
		"n6": {netip.MustParsePrefix("10.244.6.0/24"), netip.MustParsePrefix("fd00:6::/64")},
		"n9": {netip.MustParsePrefix("10.97.9.0/24")},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("peer pod CIDRs\n got %v\nwant %v", got, want)
	}
}
