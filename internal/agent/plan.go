package agent

import (
	"maps"
	"net/netip"
	"slices"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/liveness"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/routing"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// A Plan is a node state as this node enforces it: its compiled rules in
// the datapath's own types, its paths and pods resolved against the node
// (interfaces, next hops, network namespaces). FromNodeState makes it, the
// one place where the API's types become the datapath's; every sync of a
// reconcile reads it, and status.json keeps the last one enforced (what
// release and uninstall undo).
type Plan struct {
	Settings Settings `json:"settings"`
	// PodCIDRs are the node's pod address ranges: traffic to them is never
	// steered out of a NIC.
	PodCIDRs []netip.Prefix `json:"podCIDRs,omitempty"`
	Paths    []PlanPath     `json:"paths,omitempty"`
	Rules    []PlanRule     `json:"rules,omitempty"`
	Pods     []PlanPod      `json:"pods,omitempty"`
	// Liveness are the paths probed to peers and their peers; the marks
	// are the datapath's, filled in when probing starts.
	Liveness []liveness.Path `json:"liveness,omitempty"`
	// PeerCIDRs are the peers' pod CIDRs, by node name: a path the
	// probes find down towards one peer alone carries nothing to them.
	PeerCIDRs map[string][]netip.Prefix `json:"peerCIDRs,omitempty"`
	// ProbedPeers counts the peers liveness probes; UnprobedPeers are
	// those that share a path with the node beyond limits.ProbedPeers,
	// by name, that it leaves out (probedPeers).
	ProbedPeers   int      `json:"probedPeers,omitempty"`
	UnprobedPeers []string `json:"unprobedPeers,omitempty"`
	// Awaiting are the node's paths left out because no single link
	// matches them (none, or several): a link that appears or goes away
	// may settle them, so any link event asks for a reconcile.
	Awaiting []AwaitingPath `json:"awaiting,omitempty"`
}

// AwaitingPath is a path of the node state that waits for its link.
type AwaitingPath struct {
	Name  string `json:"name"`
	Index uint32 `json:"index"`
	// Away: the path was in force and its link went (a NIC removed, to
	// be created again). Such a path is down, not gone: its place in its
	// rules' join counts stays, and the joins waiting for it go on
	// waiting (links.go). A path whose link was never found counts for
	// nothing.
	Away bool `json:"away,omitempty"`
}

// PlanPath is one of the node's paths: its routing (its index, the NIC
// found for it and the next hop beyond) and its capacity.
type PlanPath struct {
	routing.Path
	// Capacity in bits per second bounds the path's caps and the HTB
	// classes on its NIC; 0: unbounded.
	Capacity uint64 `json:"capacity,omitempty"`
	// SharedRiskGroup is what the path shares with the others of the
	// same group (an uplink, a switch); empty: nothing.
	SharedRiskGroup string `json:"sharedRiskGroup,omitempty"`
}

// PlanRule is one compiled rule: what the datapath does for the
// connections it selects, its caps, and what the agent sets up inside the
// pods whose first rule it is.
type PlanRule struct {
	// Name is the rule's identity (the node state's): its datapath id is
	// kept by name (ruleids.go).
	Name string `json:"name"`
	// Policy and Generation are reported back as applied.
	Policy     string `json:"policy,omitempty"`
	Generation int64  `json:"generation,omitempty"`
	// Datapath is the selector and the spread, backup and block actors'
	// data, by path index.
	Datapath datapath.Rule `json:"datapath"`
	// Rate is the rate actor's caps, nil for none.
	Rate *datapath.RateConfig `json:"rate,omitempty"`
	// MPTCP is what the agent sets up inside the pods whose first rule
	// this is.
	podnet.MPTCP
}

// PlanPod is one of the node's selected pods, where the agent found it.
type PlanPod struct {
	// Name is namespace.name, for logs and metrics.
	Name string `json:"name"`
	// Ref is the pod in the API (its gate is written there).
	Ref PodRef `json:"ref"`
	// NetNS is the path of the pod's network namespace.
	NetNS string `json:"netns"`
	// HostInterface is the pod's host-side veth.
	HostInterface string       `json:"hostInterface"`
	IPs           []netip.Addr `json:"ips"`
	// Rules are the pod's rules by name, highest priority first: each new
	// subflow takes the first whose traffic selects it.
	Rules []string `json:"rules"`
	// Transparent is the transparent MPTCP the pod has: under kernel the
	// socket program makes the TCP sockets created in its namespace MPTCP;
	// under either, a listener that takes TCP only is reported.
	Transparent Transparency `json:"transparent,omitempty"`
}

// Transparency is the transparent MPTCP a pod has (the node state's
// spec.pods[].transparent).
type Transparency string

const (
	// TransparencyInject: the webhook gave the pod's containers the
	// preload library and Go's multipathtcp=1.
	TransparencyInject Transparency = "inject"
	// TransparencyKernel: the socket program covers the pod's namespace.
	TransparencyKernel Transparency = "kernel"
)

// PodRef names a pod of the API.
type PodRef struct{ Namespace, Name, UID string }

// rule returns the rule of p named name, or nil.
func (p *Plan) rule(name string) *PlanRule {
	for i := range p.Rules {
		if p.Rules[i].Name == name {
			return &p.Rules[i]
		}
	}
	return nil
}

// firstRule is the rule a pod's MPTCP settings follow: its first.
func (p *Plan) firstRule(pod PlanPod) *PlanRule {
	if len(pod.Rules) == 0 {
		return nil
	}
	return p.rule(pod.Rules[0])
}

// CongestionControls counts the plan's pods by the congestion control the
// agent set in them (their first rule's), by name; pods it leaves theirs
// are not counted.
func (p *Plan) CongestionControls() []mptcpv1alpha1.PodCongestionControl {
	n := map[string]int32{}
	for _, pod := range p.Pods {
		if r := p.firstRule(pod); r != nil && r.CongestionControl != "" {
			n[r.CongestionControl]++
		}
	}
	out := make([]mptcpv1alpha1.PodCongestionControl, 0, len(n))
	for _, name := range slices.Sorted(maps.Keys(n)) {
		out = append(out, mptcpv1alpha1.PodCongestionControl{Name: name, Pods: n[name]})
	}
	return out[:min(len(out), 16)] // status.congestionControls' bound
}

// podOf is pod as the pod networking knows it.
func podOf(pod PlanPod) podnet.Pod {
	return podnet.Pod{Name: pod.Name, UID: pod.Ref.UID, NetNS: pod.NetNS, IPs: pod.IPs}
}

// pathsByIndex maps the plan's path indexes to the paths.
func (p *Plan) pathsByIndex() map[uint32]PlanPath {
	out := make(map[uint32]PlanPath, len(p.Paths))
	for _, path := range p.Paths {
		out[path.Index] = path
	}
	return out
}
