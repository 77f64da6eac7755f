package compile

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/transparent"
)

func testInput() Input {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"mp": "yes"}},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.1.1.0/24", "fd00:1::/64"}}}
	path := func(name string, idx int32) mptcpv1alpha1.MPTCPPath {
		return mptcpv1alpha1.MPTCPPath{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: mptcpv1alpha1.MPTCPPathSpec{
				NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"mp": "yes"}},
				Interface:    mptcpv1alpha1.InterfaceSelector{Name: "nic-" + name},
				Capacity:     resource.MustParse("10G"),
				DefaultRole:  mptcpv1alpha1.PathRoleActive,
				Weight:       1,
			},
			Status: mptcpv1alpha1.MPTCPPathStatus{Index: idx},
		}
	}
	policy := func(name string, prio int32, paths ...string) mptcpv1alpha1.MPTCPPolicy {
		p := mptcpv1alpha1.MPTCPPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 3},
			Spec: mptcpv1alpha1.MPTCPPolicySpec{
				Priority:          prio,
				NamespaceSelector: &metav1.LabelSelector{},
				TenantPreferences: mptcpv1alpha1.Allowed,
			},
		}
		for _, n := range paths {
			p.Spec.Spread.Paths = append(p.Spec.Spread.Paths, mptcpv1alpha1.WeightedPath{Name: n})
		}
		return p
	}
	pod := func(ns, name, ip string, ann map[string]string) corev1.Pod {
		return corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), Annotations: ann},
			Spec:       corev1.PodSpec{NodeName: "n1"},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}},
		}
	}
	return Input{
		Node:            node,
		Paths:           []mptcpv1alpha1.MPTCPPath{path("a", 1), path("b", 2), path("c", 3), path("unindexed", 0)},
		Policies:        []mptcpv1alpha1.MPTCPPolicy{policy("p1", 0, "a", "b"), policy("p2", 5, "c"), policy("p3", 0, "b", "unindexed")},
		NamespaceLabels: map[string]map[string]string{"t1": nil, "t2": nil},
		Pods: []corev1.Pod{
			pod("t1", "x", "10.1.1.1", nil),
			pod("t2", "y", "10.1.1.2", map[string]string{mptcpv1alpha1.AnnotationPreferredPaths: "b"}),
			pod("t1", "z", "10.1.1.3", map[string]string{mptcpv1alpha1.AnnotationPreferredPaths: "t2/y"}),
		},
	}
}

// TestNodeIsDeterministic: the controller decides "no write" by comparing
// serialized specs, so the order of the inputs (cache order) must never show.
func TestNodeIsDeterministic(t *testing.T) {
	in := testInput()
	want, err := json.Marshal(Node(in).Spec)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		shuffled := in
		shuffled.Paths = slices.Clone(in.Paths)
		shuffled.Policies = slices.Clone(in.Policies)
		shuffled.Pods = slices.Clone(in.Pods)
		r.Shuffle(len(shuffled.Paths), func(i, j int) { shuffled.Paths[i], shuffled.Paths[j] = shuffled.Paths[j], shuffled.Paths[i] })
		r.Shuffle(len(shuffled.Policies), func(i, j int) {
			shuffled.Policies[i], shuffled.Policies[j] = shuffled.Policies[j], shuffled.Policies[i]
		})
		r.Shuffle(len(shuffled.Pods), func(i, j int) { shuffled.Pods[i], shuffled.Pods[j] = shuffled.Pods[j], shuffled.Pods[i] })
		got, _ := json.Marshal(Node(shuffled).Spec)
		if string(got) != string(want) {
			t.Fatalf("spec depends on input order:\n got %s\nwant %s", got, want)
		}
	}
}

func TestNode(t *testing.T) {
	res := Node(testInput())
	var paths []string
	for _, p := range res.Spec.Paths {
		paths = append(paths, p.Name)
	}
	if !slices.Equal(paths, []string{"a", "b", "c"}) {
		t.Errorf("node paths %v: a path without an index must be left out", paths)
	}
	got := map[string]string{}
	for _, p := range res.Spec.Pods {
		var rules []string
		for _, name := range p.Rules {
			r := res.Spec.Rule(name)
			var names []string
			for _, rp := range r.Paths {
				names = append(names, rp.Name)
			}
			rules = append(rules, r.Policy+"("+strings.Join(names, ",")+")")
		}
		got[p.Namespace+"/"+p.Name] = strings.Join(rules, " ")
	}
	want := map[string]string{
		"t1/x": "p2(c) p1(a,b) p3(b)",
		"t2/y": "p2(c) p1(b,a) p3(b)", // preference "b" reorders p1; p2 does not contain b: refused there
		"t1/z": "p2(c) p1(a,b) p3(b)", // "t2/y" is not a path name: refused everywhere
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: rules %q, want %q", k, got[k], v)
		}
	}
	if m := res.MissingPaths["p3"]; !slices.Equal(m, []string{"unindexed"}) {
		t.Errorf("missing paths of p3: %v", m)
	}
	var refusals []string
	for _, r := range res.Refusals {
		refusals = append(refusals, r.Pod.Name+"/"+r.Policy+"/"+r.Reason)
	}
	wantRefusals := []string{ // pods in namespace/name order, policies in precedence order
		"z/p2/" + ReasonPreferencesInvalid, "z/p1/" + ReasonPreferencesInvalid, "z/p3/" + ReasonPreferencesInvalid,
		"y/p2/" + ReasonPreferencesOutside,
	}
	if !slices.Equal(refusals, wantRefusals) {
		t.Errorf("refusals %v, want %v", refusals, wantRefusals)
	}
}

// A pod takes at most as many policies as its selector chain in the
// datapath holds: those of lowest precedence are left out of its rules and
// the pod is told (a Warning event), instead of the node's agent refusing
// A rule is known by its policy and, for a tenant's variant, its
// preference: pods a policy selects alike share one rule; a pod whose
// preference reorders the policy's paths has its own; and a change to the
// policy keeps every rule's name (the agent rewrites it in place, so its
// live connections follow), where the name of a rule hashed from its
// content would move them to a rule nobody updates.
func TestRuleNamesFollowPoliciesNotTheirContent(t *testing.T) {
	in := testInput()
	names := func(in Input) map[string][]string {
		out := map[string][]string{}
		for _, p := range Node(in).Spec.Pods {
			out[p.Name] = p.Rules
		}
		return out
	}
	before := names(in)
	if x, y := before["x"], before["y"]; !slices.Equal(x, []string{"p2", "p1", "p3"}) || y[0] != "p2" ||
		!strings.HasPrefix(y[1], "p1@") || !strings.HasPrefix(y[2], "p3@") {
		t.Fatalf("rules of x %v and y %v: want the policies' own for x, variants for y where its preference applies (p1, p3; not p2)", x, y)
	}
	if z := before["z"]; !slices.Equal(z, before["x"]) {
		t.Errorf("z (its preference refused) has rules %v, want x's %v", z, before["x"])
	}
	in.Policies[0].Spec.Spread.Paths = append(in.Policies[0].Spec.Spread.Paths, mptcpv1alpha1.WeightedPath{Name: "c"})
	in.Policies[0].Spec.MaxSubflows = 4
	in.Policies[0].Generation++
	after := names(in)
	for pod, rules := range before {
		if !slices.Equal(after[pod], rules) {
			t.Errorf("pod %s: rules %v after its policy changed, want %v: the same rules, rewritten", pod, after[pod], rules)
		}
	}
	spec := Node(in).Spec
	if r := spec.Rule("p1"); r == nil || r.MaxSubflows != 4 || len(r.Paths) != 3 {
		t.Errorf("rule p1 after the change: %+v", r)
	}
	in.Pods[1].Annotations[mptcpv1alpha1.AnnotationPreferredPaths] = "c"
	if y := names(in)["y"]; y[1] == before["y"][1] || !strings.HasPrefix(y[1], "p1@") {
		t.Errorf("y's rule %q after its preference changed, want another variant than %q", y[1], before["y"][1])
	}
}

// the whole node.
func TestAPodTakesAtMostEightPolicies(t *testing.T) {
	in := testInput()
	in.Pods = in.Pods[:1]
	in.Policies = nil
	for i := range 10 {
		p := mptcpv1alpha1.MPTCPPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%02d", i)},
			Spec: mptcpv1alpha1.MPTCPPolicySpec{NamespaceSelector: &metav1.LabelSelector{},
				Spread: mptcpv1alpha1.Spread{Paths: []mptcpv1alpha1.WeightedPath{{Name: "a"}}}}}
		in.Policies = append(in.Policies, p)
	}
	res := Node(in)
	if len(res.Spec.Pods) != 1 || len(res.Spec.Pods[0].Rules) != mptcpv1alpha1.MaxPodPolicies {
		t.Fatalf("pods %+v, want one with %d rules", res.Spec.Pods, mptcpv1alpha1.MaxPodPolicies)
	}
	if last := res.Spec.Rule(res.Spec.Pods[0].Rules[mptcpv1alpha1.MaxPodPolicies-1]).Policy; last != "p07" {
		t.Errorf("last rule kept is %s, want p07 (precedence: priority, then name)", last)
	}
	if len(res.Refusals) != 1 || res.Refusals[0].Reason != ReasonTooManyPolicies ||
		!strings.Contains(res.Refusals[0].Message, "10 policies select the pod, a pod takes at most 8: p08, p09") {
		t.Errorf("refusals %+v, want one TooManyPolicies naming p08 and p09", res.Refusals)
	}
}

// A pod that runs a KubeVirt VM gets guest mode whatever its policy's
// subflowCreation, in a rule of its own that the policy's other pods do not
// share, and an event says why; a policy in guest mode already needs no
// variant and no event.
func TestAVMPodGetsGuestMode(t *testing.T) {
	in := testInput()
	in.Pods = in.Pods[:1]
	vm := in.Pods[0]
	vm.Name, vm.UID, vm.Status.PodIPs = "virt-launcher-db-abcde", "uid-vm", []corev1.PodIP{{IP: "10.1.1.9"}}
	vm.Labels = map[string]string{LabelVirtLauncher: LabelVirtLauncherValue}
	in.Pods = append(in.Pods, vm)
	in.Policies = []mptcpv1alpha1.MPTCPPolicy{in.Policies[0], in.Policies[1]}
	in.Policies[0].Spec.PodMPTCP = mptcpv1alpha1.PodMPTCP{SubflowCreation: mptcpv1alpha1.SubflowCreationSignal, SignalPorts: []int32{6002}}
	in.Policies[1].Spec.PodMPTCP = mptcpv1alpha1.PodMPTCP{SubflowCreation: mptcpv1alpha1.SubflowCreationGuest}
	res := Node(in)
	byPod := map[string][]string{}
	for _, p := range res.Spec.Pods {
		byPod[p.Name] = p.Rules
	}
	for _, name := range byPod["virt-launcher-db-abcde"] {
		r := res.Spec.Rule(name)
		if r.SubflowCreation != mptcpv1alpha1.SubflowCreationGuest || len(r.SignalPorts) != 0 {
			t.Errorf("the VM pod's rule %s: mode %s, signal ports %v; want guest, none", name, r.SubflowCreation, r.SignalPorts)
		}
	}
	if got := res.Spec.Rule(byPod["x"][1]); got.SubflowCreation != mptcpv1alpha1.SubflowCreationSignal || got.Name != "p1" {
		t.Errorf("the other pod's rule from p1 is %s in mode %s, want p1 in signal mode", got.Name, got.SubflowCreation)
	}
	if slices.Equal(byPod["x"], byPod["virt-launcher-db-abcde"]) || byPod["virt-launcher-db-abcde"][0] != "p2" {
		t.Errorf("rules: pod x %v, VM pod %v; want p2 shared (already guest) and p1's a variant of the VM's own", byPod["x"], byPod["virt-launcher-db-abcde"])
	}
	if len(res.Refusals) != 1 || res.Refusals[0].Reason != ReasonVMGuestMode || res.Refusals[0].Pod.Name != "virt-launcher-db-abcde" ||
		!strings.Contains(res.Refusals[0].Message, "policy p1's subflowCreation signal cannot act inside it, so guest applies") {
		t.Errorf("refusals %+v, want one VMGuestMode for the VM pod and p1", res.Refusals)
	}
}

// A pod selected by a policy that sets podMPTCP.transparent, but that does
// not carry the mode (created before the policy, while the webhook was
// down, or changed under another mode), is told so; a pod that carries it,
// one that opted out and a VM's pod are not; the policy of highest
// precedence that sets it is the one named.
func TestAPodThatMissedTransparentIsToldSo(t *testing.T) {
	in := testInput()
	in.Pods = in.Pods[:1]
	base := in.Pods[0]
	pod := func(name string, annotations, labels map[string]string) corev1.Pod {
		p := base
		p.Name, p.UID, p.Annotations, p.Labels = name, types.UID("uid-"+name), annotations, labels
		return p
	}
	in.Pods = []corev1.Pod{
		pod("missed", nil, nil),
		pod("changed", map[string]string{transparent.AnnotationMode: "inject"}, nil),
		pod("other-mode", map[string]string{transparent.AnnotationMode: "off"}, nil),
		pod("opted-out", map[string]string{transparent.AnnotationMode: transparent.OptOut}, nil),
		pod("vm", nil, map[string]string{LabelVirtLauncher: LabelVirtLauncherValue}),
	}
	in.Policies[0].Spec.PodMPTCP.Transparent = mptcpv1alpha1.TransparentOff
	in.Policies[1].Spec.PodMPTCP.Transparent = mptcpv1alpha1.TransparentInject // priority 5: first
	res := Node(in)
	told := map[string]string{}
	for _, r := range res.Refusals {
		if r.Reason == ReasonTransparentNotApplied {
			told[r.Pod.Name] = r.Policy
		}
	}
	if want := map[string]string{"missed": "p2", "other-mode": "p2"}; !maps.Equal(told, want) {
		t.Errorf("told %v, want %v", told, want)
	}
	injected := map[string]mptcpv1alpha1.PodTransparency{}
	for _, p := range res.Spec.Pods {
		injected[p.Name] = p.Transparent
	}
	// Only the pod the webhook changed for inject has it.
	if want := map[string]mptcpv1alpha1.PodTransparency{"missed": "", "changed": "inject", "other-mode": "", "opted-out": "", "vm": ""}; !maps.Equal(injected, want) {
		t.Errorf("node pods' transparent under inject %v, want %v", injected, want)
	}

	// kernel is the agent's, on the pods as they are: the node state
	// says it for each pod but the VM's and the one that opted out, and
	// nobody is told to restart.
	in.Policies[1].Spec.PodMPTCP.Transparent = mptcpv1alpha1.TransparentKernel
	res = Node(in)
	for _, r := range res.Refusals {
		if r.Reason == ReasonTransparentNotApplied {
			t.Errorf("pod %s told %q under kernel", r.Pod.Name, r.Message)
		}
	}
	kernel := map[string]mptcpv1alpha1.PodTransparency{}
	for _, p := range res.Spec.Pods {
		kernel[p.Name] = p.Transparent
	}
	want := map[string]mptcpv1alpha1.PodTransparency{"missed": "kernel", "changed": "kernel", "other-mode": "kernel", "opted-out": "", "vm": ""}
	if !maps.Equal(kernel, want) {
		t.Errorf("node pods' transparent under kernel %v, want %v", kernel, want)
	}
}

// A path's defaultRole and weight act where a policy does not say
// otherwise: a path backup by default is one of the rule's backup paths
// (after the policy's own) where the policy allows header rewriting, and
// stays active where it does not or where the policy gives it role active;
// a policy all of whose paths are backup by default uses them as active.
func TestDefaultRoleAndWeightActWhereAPolicySaysNothing(t *testing.T) {
	in := testInput()
	in.Pods = in.Pods[:1]
	for i := range in.Paths {
		if in.Paths[i].Name == "b" {
			in.Paths[i].Spec.DefaultRole = mptcpv1alpha1.PathRoleBackup
			in.Paths[i].Spec.Weight = 7
		}
	}
	policy := func(rewriting mptcpv1alpha1.Permission, paths ...mptcpv1alpha1.WeightedPath) []mptcpv1alpha1.MPTCPPolicy {
		return []mptcpv1alpha1.MPTCPPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "p"},
			Spec: mptcpv1alpha1.MPTCPPolicySpec{NamespaceSelector: &metav1.LabelSelector{}, HeaderRewriting: rewriting,
				Spread: mptcpv1alpha1.Spread{Paths: paths}}}}
	}
	a, b := mptcpv1alpha1.WeightedPath{Name: "a"}, mptcpv1alpha1.WeightedPath{Name: "b"}
	activeB := mptcpv1alpha1.WeightedPath{Name: "b", Role: mptcpv1alpha1.PathRoleActive}
	for name, c := range map[string]struct {
		policies []mptcpv1alpha1.MPTCPPolicy
		want     string // active paths with weights | backup paths
	}{
		"backup by default":                 {policy(mptcpv1alpha1.Allowed, a, b), "a/1|b"},
		"no header rewriting: stays active": {policy(mptcpv1alpha1.Forbidden, a, b), "a/1,b/7|"},
		"the policy says active":            {policy(mptcpv1alpha1.Allowed, a, activeB), "a/1,b/7|"},
		"nothing to back up":                {policy(mptcpv1alpha1.Allowed, b), "b/7|"},
	} {
		t.Run(name, func(t *testing.T) {
			in.Policies = c.policies
			res := Node(in)
			if len(res.Spec.Rules) != 1 {
				t.Fatalf("rules %+v", res.Spec.Rules)
			}
			r := res.Spec.Rules[0]
			var active []string
			for _, p := range r.Paths {
				active = append(active, fmt.Sprintf("%s/%d", p.Name, p.Weight))
			}
			if got := strings.Join(active, ",") + "|" + strings.Join(r.BackupPaths, ","); got != c.want {
				t.Errorf("rule %s, want %s", got, c.want)
			}
		})
	}
}

func TestParsePreferredPaths(t *testing.T) {
	cases := map[string]struct {
		value string   // annotation value
		want  []string // parsed names; nil when refused
	}{
		"one path":                     {value: "fabric-a", want: []string{"fabric-a"}},
		"two paths with spaces":        {value: " fabric-b , fabric-a", want: []string{"fabric-b", "fabric-a"}},
		"empty":                        {value: " "},
		"empty element":                {value: "fabric-a,,fabric-b"},
		"a namespace/pod reference":    {value: "other-ns/db"},
		"a selector":                   {value: "app=db:fabric-a"},
		"upper case":                   {value: "Fabric-A"},
		"a path twice":                 {value: "fabric-a,fabric-a"},
		"more paths than any policy":   {value: strings.Repeat("p,", 16) + "p"},
		"a path name that is too long": {value: strings.Repeat("x", 64)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, problem := ParsePreferredPaths(tc.value)
			if tc.want == nil {
				if problem == "" {
					t.Fatalf("%q accepted as %v", tc.value, got)
				}
				return
			}
			if problem != "" || !slices.Equal(got, tc.want) {
				t.Fatalf("got %v (%s), want %v", got, problem, tc.want)
			}
		})
	}
}

// An agent writes its own status, so what it claims as its addresses is
// checked before other nodes probe it: only fabric unicast addresses on
// paths of its spec, each under one node. An address two nodes claim stays
// with the node whose spec the controller gave it to; where no spec has it,
// with the older node state. Nodes without pods, and nodes left with no
// address, are no peers.
func TestPeersListEachAddressUnderOneNode(t *testing.T) {
	states := []mptcpv1alpha1.MPTCPNodeState{
		nodeState("n1", 100, map[string][]string{"a": nil, "b": nil}, map[string][]string{"a": {"192.0.2.1"}}),
		nodeState("n2", 200, map[string][]string{"a": nil, "b": nil}, map[string][]string{
			"a": {"127.0.0.1", "fe80::1", "224.0.0.1", "0.0.0.0", "2001:db8::2%eth0", "192.0.2.2", "::ffff:198.51.100.2"},
			"b": {"203.0.113.2"},
		}),
		// n3 claims n2's address on a (its state is younger, and no spec
		// has the address: n2 keeps it), its own on b.
		nodeState("n3", 300, map[string][]string{"a": nil, "b": {"203.0.113.3"}}, map[string][]string{"a": {"192.0.2.2"}, "b": {"203.0.113.3"}}),
		// n5 is the oldest and claims n3's address on b, which n3's spec
		// has: n3 keeps it. Its own address on c stays its own.
		nodeState("n5", 50, map[string][]string{"b": nil, "c": nil}, map[string][]string{"b": {"203.0.113.3"}, "c": {"192.0.2.5"}}),
		// n6 reports a path its spec does not have.
		nodeState("n6", 60, map[string][]string{"a": nil}, map[string][]string{"z": {"192.0.2.6"}}),
	}
	n4 := nodeState("n4", 400, map[string][]string{"a": nil}, map[string][]string{"a": {"192.0.2.4"}})
	n4.Spec.Pods = nil
	states = append(states, n4)
	// n2's pod CIDRs go with it (a path down towards it alone carries
	// nothing to them); n3 has none.
	states[1].Spec.PodCIDRs = []string{"10.244.2.0/24", "fd00:2::/64"}
	got := PeerSpecs(states)
	want := map[string]mptcpv1alpha1.MPTCPPeerSpec{
		"n1": {Paths: []mptcpv1alpha1.PeerPath{{Name: "a", Addresses: []string{"192.0.2.1"}}}},
		"n2": {Paths: []mptcpv1alpha1.PeerPath{{Name: "a", Addresses: []string{"192.0.2.2", "198.51.100.2"}}, {Name: "b", Addresses: []string{"203.0.113.2"}}},
			PodCIDRs: []string{"10.244.2.0/24", "fd00:2::/64"}},
		"n3": {Paths: []mptcpv1alpha1.PeerPath{{Name: "b", Addresses: []string{"203.0.113.3"}}}},
		"n5": {Paths: []mptcpv1alpha1.PeerPath{{Name: "c", Addresses: []string{"192.0.2.5"}}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("peers\n got %+v\nwant %+v", got, want)
	}
}

// nodeState is a node state with pods, created at second created, whose
// spec has paths (with the addresses the controller gave the node, nil for
// none) and whose status reports claims.
func nodeState(name string, created int64, paths, claims map[string][]string) mptcpv1alpha1.MPTCPNodeState {
	s := mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.Unix(created, 0)}}
	s.Spec.Pods = []mptcpv1alpha1.NodePod{{Namespace: "t", Name: name, Rules: []string{"r"}}}
	for _, p := range slices.Sorted(maps.Keys(paths)) {
		s.Spec.Paths = append(s.Spec.Paths, mptcpv1alpha1.NodePath{Name: p, Addresses: paths[p]})
	}
	for _, p := range slices.Sorted(maps.Keys(claims)) {
		s.Status.Paths = append(s.Status.Paths, mptcpv1alpha1.PathState{Name: p, Addresses: claims[p]})
	}
	return s
}

// inputFor is testInput compiled for node name, its pods moved there.
func inputFor(name string, states []mptcpv1alpha1.MPTCPNodeState) Input {
	in := testInput()
	in.Node = in.Node.DeepCopy()
	in.Node.Name = name
	for i := range in.Pods {
		in.Pods[i].Spec.NodeName = name
	}
	in.NodeStates = states
	return in
}

// addressesOf are the addresses a spec gives its node, by path.
func addressesOf(spec mptcpv1alpha1.MPTCPNodeStateSpec) map[string][]string {
	out := map[string][]string{}
	for _, p := range spec.Paths {
		if len(p.Addresses) > 0 {
			out[p.Name] = p.Addresses
		}
	}
	return out
}

// withoutPeer drops node from peers.
func withoutPeer(peers map[string]mptcpv1alpha1.MPTCPPeerSpec, node string) map[string]mptcpv1alpha1.MPTCPPeerSpec {
	out := maps.Clone(peers)
	delete(out, node)
	return out
}

// contenders are the node states of states that claim an address node's
// claims, node's own first: what the controller compiles node from
// (nodestate.Reconciler.contenders).
func contenders(node string, states []mptcpv1alpha1.MPTCPNodeState) []mptcpv1alpha1.MPTCPNodeState {
	i := slices.IndexFunc(states, func(s mptcpv1alpha1.MPTCPNodeState) bool { return s.Name == node })
	mine := ClaimedAddresses(&states[i])
	out := []mptcpv1alpha1.MPTCPNodeState{states[i]}
	for j := range states {
		if j != i && slices.ContainsFunc(ClaimedAddresses(&states[j]), func(a string) bool { return slices.Contains(mine, a) }) {
			out = append(out, states[j])
		}
	}
	return out
}

// A compromised agent writes what it likes into its node state's status.
// Whatever n0 claims there (the other nodes' addresses on its own paths, on
// paths of no node, in more path states than a node has paths), no other
// node changes: neither the addresses its spec gives it nor its MPTCPPeer.
// n0 is the most favoured claimant there can be: its name sorts first and
// its node state is the oldest. Each node compiles the same from the node
// states that contend for its addresses alone as from all.
func TestANodeClaimingOtherNodesAddressesChangesNoOtherNode(t *testing.T) {
	honest := func(claims map[string][]string) []mptcpv1alpha1.MPTCPNodeState {
		return []mptcpv1alpha1.MPTCPNodeState{
			nodeState("n0", 100, map[string][]string{"a": {"192.0.2.10"}, "b": nil}, claims),
			nodeState("n1", 200, map[string][]string{"a": {"192.0.2.1"}, "b": {"203.0.113.1"}, "c": nil},
				map[string][]string{"a": {"192.0.2.1"}, "b": {"203.0.113.1"}}),
			nodeState("n2", 300, map[string][]string{"a": {"192.0.2.2"}, "b": {"203.0.113.2", "2001:db8::2"}},
				map[string][]string{"a": {"192.0.2.2"}, "b": {"203.0.113.2", "2001:db8::2"}}),
			nodeState("n3", 400, map[string][]string{"a": {"192.0.2.3"}, "b": {"203.0.113.3"}},
				map[string][]string{"a": {"192.0.2.3"}, "b": {"203.0.113.3"}}),
		}
	}
	victims := []string{"192.0.2.1", "192.0.2.2", "192.0.2.3", "203.0.113.1", "203.0.113.2", "2001:db8::2", "203.0.113.3"}
	base := map[string]Result{}
	for _, n := range []string{"n1", "n2", "n3"} {
		base[n] = Node(inputFor(n, honest(map[string][]string{"a": {"192.0.2.10"}})))
	}
	basePeers := withoutPeer(PeerSpecs(honest(map[string][]string{"a": {"192.0.2.10"}})), "n0")
	if len(basePeers) != 3 {
		t.Fatalf("before any claim: peers %+v", basePeers)
	}
	many := map[string][]string{}
	for i := range 100 {
		many[fmt.Sprintf("p%03d", i)] = victims[i%len(victims) : i%len(victims)+1]
	}
	many["a"], many["b"] = victims[:4], victims[4:]
	claims := map[string]map[string][]string{
		"on its own paths":    {"a": victims[:3], "b": victims[3:]},
		"on paths of no node": {"a": {"192.0.2.10"}, "x": victims[:4], "y": victims[4:]},
		"on a path it lacks":  {"a": {"192.0.2.10"}, "c": victims[:4]},
		"in 102 path states":  many,
	}
	for name, c := range claims {
		t.Run(name, func(t *testing.T) {
			for _, n := range []string{"n1", "n2", "n3"} {
				got := Node(inputFor(n, honest(c)))
				if !reflect.DeepEqual(addressesOf(got.Spec), addressesOf(base[n].Spec)) {
					t.Errorf("%s's addresses %v, before the claims %v", n, addressesOf(got.Spec), addressesOf(base[n].Spec))
				}
				if few := Node(inputFor(n, contenders(n, honest(c)))); !reflect.DeepEqual(few.Spec, got.Spec) {
					t.Errorf("%s compiled from its contenders alone\n got %+v\nwant %+v", n, few.Spec.Paths, got.Spec.Paths)
				}
			}
			if got := withoutPeer(PeerSpecs(honest(c)), "n0"); !reflect.DeepEqual(got, basePeers) {
				t.Errorf("peers\n got %+v\nwant %+v", got, basePeers)
			}
		})
	}
}

// The addresses a node's spec gives it are its claims on its paths that no
// other node has: an address two nodes claim stays where a spec has it (the
// first node given it, however old the other node state is), and where none
// has it goes to the older node state. A path new to the spec counts at
// once.
func TestAContestedAddressStaysWithItsFirstOwner(t *testing.T) {
	// n2's state is the older; both claim 192.0.2.1 on a.
	states := func(n1Given []string) []mptcpv1alpha1.MPTCPNodeState {
		return []mptcpv1alpha1.MPTCPNodeState{
			nodeState("n1", 200, map[string][]string{"a": n1Given}, map[string][]string{"a": {"192.0.2.1"}, "c": {"198.51.100.1"}}),
			nodeState("n2", 100, map[string][]string{"a": nil}, map[string][]string{"a": {"192.0.2.1", "192.0.2.2"}}),
		}
	}
	for name, c := range map[string]struct {
		n1Given []string
		n1, n2  map[string][]string
	}{
		"given to n1 before":  {n1Given: []string{"192.0.2.1"}, n1: map[string][]string{"a": {"192.0.2.1"}, "c": {"198.51.100.1"}}, n2: map[string][]string{"a": {"192.0.2.2"}}},
		"given to no one yet": {n1: map[string][]string{"c": {"198.51.100.1"}}, n2: map[string][]string{"a": {"192.0.2.1", "192.0.2.2"}}},
	} {
		t.Run(name, func(t *testing.T) {
			for node, want := range map[string]map[string][]string{"n1": c.n1, "n2": c.n2} {
				got := addressesOf(Node(inputFor(node, states(c.n1Given))).Spec)
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%s is given %v, want %v", node, got, want)
				}
			}
		})
	}
}

// A userspace-mode rule carries its policy's join threshold, or the
// default where the policy sets none; a rule whose joins the agent does not
// open (signal, or guest for a pod that runs a VM) carries none. A path's
// shared-risk group goes with it into the node state.
func TestJoinThresholdAndSharedRiskGroupReachTheNodeState(t *testing.T) {
	in := testInput()
	in.Pods = in.Pods[:1]
	in.Paths[0].Spec.SharedRiskGroup = "tor-1"
	threshold := resource.MustParse("1Mi")
	for name, c := range map[string]struct {
		podMPTCP mptcpv1alpha1.PodMPTCP
		vm       bool
		want     int64
	}{
		"unset":           {want: mptcpv1alpha1.DefaultJoinAfterBytes},
		"set":             {podMPTCP: mptcpv1alpha1.PodMPTCP{JoinAfterBytes: &threshold}, want: 1 << 20},
		"zero":            {podMPTCP: mptcpv1alpha1.PodMPTCP{JoinAfterBytes: resource.NewQuantity(0, resource.BinarySI)}, want: 0},
		"signal":          {podMPTCP: mptcpv1alpha1.PodMPTCP{SubflowCreation: mptcpv1alpha1.SubflowCreationSignal, SignalPorts: []int32{6002}}, want: 0},
		"a pod with a VM": {podMPTCP: mptcpv1alpha1.PodMPTCP{JoinAfterBytes: &threshold}, vm: true, want: 0},
	} {
		t.Run(name, func(t *testing.T) {
			in.Policies = in.Policies[:1]
			in.Policies[0].Spec.PodMPTCP = c.podMPTCP
			in.Pods[0].Labels = nil
			if c.vm {
				in.Pods[0].Labels = map[string]string{LabelVirtLauncher: LabelVirtLauncherValue}
			}
			res := Node(in)
			if len(res.Spec.Rules) != 1 {
				t.Fatalf("rules %+v", res.Spec.Rules)
			}
			if got := res.Spec.Rules[0].JoinAfterBytes; got != c.want {
				t.Errorf("joinAfterBytes %d, want %d", got, c.want)
			}
			for _, p := range res.Spec.Paths {
				if want := map[string]string{"a": "tor-1"}[p.Name]; p.SharedRiskGroup != want {
					t.Errorf("path %s: shared-risk group %q, want %q", p.Name, p.SharedRiskGroup, want)
				}
			}
		})
	}
}

// A rule carries its policy's congestion control, cubic where the policy
// sets none (an object stored before the field had no default applied),
// and none where the agent leaves the pod's stack alone (guest, or a pod
// that runs a VM).
func TestCongestionControlReachesTheNodeState(t *testing.T) {
	in := testInput()
	in.Pods = in.Pods[:1]
	for name, c := range map[string]struct {
		podMPTCP mptcpv1alpha1.PodMPTCP
		vm       bool
		want     string
	}{
		"unset":           {want: "cubic"},
		"set":             {podMPTCP: mptcpv1alpha1.PodMPTCP{CongestionControl: "bbr"}, want: "bbr"},
		"signal":          {podMPTCP: mptcpv1alpha1.PodMPTCP{SubflowCreation: mptcpv1alpha1.SubflowCreationSignal, CongestionControl: "reno"}, want: "reno"},
		"guest":           {podMPTCP: mptcpv1alpha1.PodMPTCP{SubflowCreation: mptcpv1alpha1.SubflowCreationGuest, CongestionControl: "bbr"}},
		"a pod with a VM": {podMPTCP: mptcpv1alpha1.PodMPTCP{CongestionControl: "bbr"}, vm: true},
	} {
		t.Run(name, func(t *testing.T) {
			in.Policies = in.Policies[:1]
			in.Policies[0].Spec.PodMPTCP = c.podMPTCP
			in.Pods[0].Labels = nil
			if c.vm {
				in.Pods[0].Labels = map[string]string{LabelVirtLauncher: LabelVirtLauncherValue}
			}
			res := Node(in)
			if len(res.Spec.Rules) != 1 {
				t.Fatalf("rules %+v", res.Spec.Rules)
			}
			if got := res.Spec.Rules[0].CongestionControl; got != c.want {
				t.Errorf("congestionControl %q, want %q", got, c.want)
			}
		})
	}
}

// Every rate limit of a policy reaches its compiled rule, perNamespace
// included: the agent enforces what the node state says, nothing else.
func TestRateLimitsReachTheNodeState(t *testing.T) {
	in := testInput()
	in.Pods = in.Pods[:1]
	in.Policies = in.Policies[:1]
	in.Pods[0].Labels = nil
	path := in.Paths[0].Name
	in.Policies[0].Spec.RateLimits = &mptcpv1alpha1.RateLimits{Mode: mptcpv1alpha1.RateModeShape,
		PerPod: ptrQty("300M"), PerNamespace: ptrQty("1G"), PerPath: []mptcpv1alpha1.PathRate{{Path: path, Rate: resource.MustParse("2G")}}}
	res := Node(in)
	if len(res.Spec.Rules) != 1 || res.Spec.Rules[0].RateLimits == nil {
		t.Fatalf("rules %+v", res.Spec.Rules)
	}
	rl := res.Spec.Rules[0].RateLimits
	if rl.Mode != mptcpv1alpha1.RateModeShape || rl.PerPod.String() != "300M" || rl.PerNamespace == nil ||
		rl.PerNamespace.String() != "1G" || len(rl.PerPath) != 1 || rl.PerPath[0].Rate.String() != "2G" {
		t.Errorf("compiled rate limits %+v, want shape, perPod 300M, perNamespace 1G, perPath %s 2G", rl, path)
	}
}

func ptrQty(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}
