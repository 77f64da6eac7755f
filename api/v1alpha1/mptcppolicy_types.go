package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPFamily restricts a policy's traffic to one address family.
// +kubebuilder:validation:Enum=IPv4;IPv6;Any
type IPFamily string

const (
	IPFamilyIPv4 IPFamily = "IPv4"
	IPFamilyIPv6 IPFamily = "IPv6"
	IPFamilyAny  IPFamily = "Any"
)

// PortRange is a destination TCP port or an inclusive range of them.
type PortRange struct {
	// port is the first (or only) port.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`

	// endPort, when set, makes the match the range [port, endPort].
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	EndPort int32 `json:"endPort,omitempty"`
}

// TrafficMatch is the selector chain: which of the selected pods' TCP traffic
// the policy applies to. Every set field must match; unset fields match all.
// Its CEL rules are on MPTCPPolicySpec's field, so that the node state, which
// copies the match into its unbounded list of rules, carries none of them
// (per-item rules there would exceed the API server's cost budget).
type TrafficMatch struct {
	// cidrs are the remote networks, e.g. "10.20.0.0/16" or "fd00::/8".
	// IPv4 networks are written in IPv4 form: an IPv4-mapped IPv6 network
	// (::ffff:10.0.0.0/104) is refused, as no packet carries such an
	// address.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=43
	CIDRs []string `json:"cidrs,omitempty"`

	// ports are remote TCP ports.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Ports []PortRange `json:"ports,omitempty"`

	// family restricts the match to one address family.
	// +optional
	// +kubebuilder:default=Any
	Family IPFamily `json:"family,omitempty"`
}

// SpreadMode says how a connection's new subflows are placed on the spread
// paths.
// +kubebuilder:validation:Enum=weighted;roundRobin;preferredFirst
type SpreadMode string

const (
	SpreadWeighted       SpreadMode = "weighted"
	SpreadRoundRobin     SpreadMode = "roundRobin"
	SpreadPreferredFirst SpreadMode = "preferredFirst"
)

// WeightedPath names a path and its share of subflow placements.
type WeightedPath struct {
	// name of an MPTCPPath.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// weight is the path's share of placements; when unset, the path's own
	// spec.weight.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=255
	Weight int32 `json:"weight,omitempty"`

	// role of the path in this policy; when unset, the path's own
	// spec.defaultRole. A backup path takes a connection's first subflow
	// only when no active path is up and its joins after the active
	// paths, flagged backup into the pod (MP_JOIN B bit, MP_PRIO), which
	// rewrites headers: backup needs headerRewriting: Allowed, and a
	// policy without it uses a path whose defaultRole is backup as an
	// active one.
	// +optional
	Role PathRole `json:"role,omitempty"`
}

// Spread is the main actor: the paths that carry the pods' subflows.
type Spread struct {
	// paths in order of preference.
	// +required
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=15
	Paths []WeightedPath `json:"paths"`

	// mode of placement.
	// +optional
	// +kubebuilder:default=weighted
	Mode SpreadMode `json:"mode,omitempty"`
}

// RateMode is how a rate limit is enforced. window lowers the advertised
// receive window (caps a connection, never a pod or a path: the MPTCP v1
// window is the connection's, shared by all its subflows, RFC 8684 3.3.4);
// police drops above a token bucket (a loss-based sender such as cubic gets
// 0.9 of the cap or more, one that ignores loss such as bbr less, with many
// retransmissions); shape queues in HTB on the NIC. Police's drops also make
// the sender wait for retransmission timers: at 40 Mbit/s a policed
// connection spent up to 0.45 s below a tenth of its cap (shape 0.35 s,
// window 0.2 s), and on a machine whose cores were all busy up to 0.8 s
// (shape 0.35 s, window 1.2 s: docs/benchmarks.md, "Rate modes: longest
// stall", and docs/testing.md, "Stalls"); where such pauses matter, use
// shape.
// +kubebuilder:validation:Enum=window;police;shape
type RateMode string

const (
	RateModeWindow RateMode = "window"
	RateModePolice RateMode = "police"
	RateModeShape  RateMode = "shape"
)

// PathRate caps the policy's traffic on one path.
type PathRate struct {
	// path is the name of one of the policy's paths.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Path string `json:"path"`

	// rate in bits per second.
	// +required
	// +kubebuilder:validation:XValidation:rule="!string(self).endsWith('i')",message="rate is in bits per second: write a decimal SI quantity (e.g. 5G, 100M), not a binary one (5Gi, 100Mi)"
	// +kubebuilder:validation:XValidation:rule="quantity(self).isInteger() && quantity(self).isGreaterThan(quantity('0'))",message="rate must be a positive whole number of bits per second, e.g. 50M"
	Rate resource.Quantity `json:"rate"`
}

// RateLimits are the rate actor's caps, all in bits per second.
// +kubebuilder:validation:XValidation:rule="!(self.mode == 'window' && (has(self.perPod) || has(self.perPath) || has(self.perNamespace)))",message="mode window caps connections only (perConnection): a receive window belongs to one connection (RFC 8684 3.3.4); perPod, perNamespace and perPath need police or shape"
// +kubebuilder:validation:XValidation:rule="!(self.mode == 'shape' && has(self.perConnection))",message="mode shape queues per pod, per namespace and per path in HTB; perConnection needs police or window"
// +kubebuilder:validation:XValidation:rule="!has(self.direction) || self.mode == 'police'",message="direction is for mode police only: window caps what the pod receives, shape what it sends"
// +kubebuilder:validation:XValidation:rule="has(self.perConnection) || has(self.perPod) || has(self.perNamespace) || has(self.perPath)",message="rateLimits must set at least one of perConnection, perPod, perNamespace or perPath"
type RateLimits struct {
	// mode of enforcement. window lowers the receive window the pods
	// advertise (perConnection only; needs headerRewriting: Allowed);
	// police drops above a token bucket: a cubic sender gets 0.9 of the cap
	// or more, one that ignores loss (bbr) less, and the drops leave a
	// connection below a tenth of its cap for up to 0.45 s at a time
	// (0.8 s on a starved machine, and window 1.2 s there); shape
	// queues in HTB on the NIC, with the shortest pauses (up to 0.35 s).
	// Measured in docs/benchmarks.md and docs/testing.md ("Stalls").
	// +required
	Mode RateMode `json:"mode"`

	// perConnection caps each MPTCP connection (all its subflows).
	// +optional
	// +kubebuilder:validation:XValidation:rule="!string(self).endsWith('i')",message="perConnection is in bits per second: write a decimal SI quantity (e.g. 5G, 100M), not a binary one (5Gi, 100Mi)"
	// +kubebuilder:validation:XValidation:rule="quantity(self).isInteger() && quantity(self).isGreaterThan(quantity('0'))",message="perConnection must be a positive whole number of bits per second, e.g. 500M"
	PerConnection *resource.Quantity `json:"perConnection,omitempty"`

	// perPod caps each selected pod: all its traffic on the rule's paths
	// together, whatever the protocol.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!string(self).endsWith('i')",message="perPod is in bits per second: write a decimal SI quantity (e.g. 5G, 100M), not a binary one (5Gi, 100Mi)"
	// +kubebuilder:validation:XValidation:rule="quantity(self).isInteger() && quantity(self).isGreaterThan(quantity('0'))",message="perPod must be a positive whole number of bits per second, e.g. 2G"
	PerPod *resource.Quantity `json:"perPod,omitempty"`

	// perNamespace caps the selected pods of each namespace on a node
	// together (police: one bucket; shape: one HTB class above the pods'),
	// so that running more pods brings a tenant no more. When the pods of
	// a namespace on a node have several rules with perNamespace in one
	// mode, the smallest holds for them all.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!string(self).endsWith('i')",message="perNamespace is in bits per second: write a decimal SI quantity (e.g. 5G, 100M), not a binary one (5Gi, 100Mi)"
	// +kubebuilder:validation:XValidation:rule="quantity(self).isInteger() && quantity(self).isGreaterThan(quantity('0'))",message="perNamespace must be a positive whole number of bits per second, e.g. 1G"
	PerNamespace *resource.Quantity `json:"perNamespace,omitempty"`

	// perPath caps the policy's traffic on a path, per node.
	// +optional
	// +listType=map
	// +listMapKey=path
	// +kubebuilder:validation:MaxItems=15
	PerPath []PathRate `json:"perPath,omitempty"`

	// direction is what police caps: egress (what the pod sends), ingress
	// (what it receives) or both.
	// +optional
	Direction RateDirection `json:"direction,omitempty"`

	// burst is, in bytes, how deep each police bucket is and how much
	// window mode grants at once. Unset: 200 ms at the largest cap, within
	// the same bounds. Below 64Ki a bucket drops whole TSO bursts and TCP
	// collapses far below its cap; 1Gi bounds what a connection sends at
	// once.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(self).isInteger() && quantity(self).compareTo(quantity('64Ki')) >= 0 && quantity(self).compareTo(quantity('1Gi')) <= 0",message="burst must be a whole number of bytes from 64Ki to 1Gi"
	Burst *resource.Quantity `json:"burst,omitempty"`
}

// RateDirection is the traffic of a pod that police caps.
// +kubebuilder:validation:Enum=egress;ingress;both
type RateDirection string

const (
	RateEgress  RateDirection = "egress"
	RateIngress RateDirection = "ingress"
	RateBoth    RateDirection = "both"
)

// SubflowCreation is who creates a managed pod's extra subflows.
//   - userspace: the agent is the pod's userspace path manager and creates the
//     joins itself (works toward unmanaged servers, and re-creates subflows
//     after a failure).
//   - signal: server pods announce extra ports (signal endpoints); clients
//     join them. K paths need K-1 ports that the tenant can no longer bind.
//   - guest: the workload's own path manager creates subflows (VM guests,
//     unmanaged stacks); the host only places them.
//
// +kubebuilder:validation:Enum=userspace;signal;guest
type SubflowCreation string

const (
	SubflowCreationUserspace SubflowCreation = "userspace"
	SubflowCreationSignal    SubflowCreation = "signal"
	SubflowCreationGuest     SubflowCreation = "guest"
)

// TransparentMPTCP is what a selected pod's programs that do not open MPTCP
// sockets themselves get, from the pod's creation on.
//
//   - inject: every container gets GODEBUG multipathtcp=1 (Go programs
//     dial and listen with MPTCP) and the preload library first in its
//     LD_PRELOAD (a program that asks libc for a TCP socket gets an MPTCP
//     one), delivered by an init container the webhook adds.
//   - kernel: the node's agent attaches a BPF program to the kernel's
//     update_socket_protocol hook that makes every TCP socket created in
//     the pod's network namespace an MPTCP one: static binaries, io_uring
//     and pods created before the policy included, the pod's spec
//     untouched. The hook needs Linux 6.6 and a kernel that runs tracing
//     programs (not in lockdown); where the kernel refuses, the node
//     state's TransparentKernel condition and the policy's Degraded
//     condition say Unsupported and why, and the pods keep the sockets
//     their programs ask for.
//   - off: every container gets GODEBUG multipathtcp=0: Go programs, whose
//     listeners take MPTCP by default since Go 1.24, use TCP only.
//
// +kubebuilder:validation:Enum=inject;kernel;off
type TransparentMPTCP string

const (
	TransparentInject TransparentMPTCP = "inject"
	TransparentKernel TransparentMPTCP = "kernel"
	TransparentOff    TransparentMPTCP = "off"
)

// PodMPTCP is what the agent configures inside a selected pod's network
// namespace before its workload starts, and what the webhook changes in
// the pod's containers at its creation.
// +kubebuilder:validation:XValidation:rule="(has(self.subflowCreation) && self.subflowCreation == 'signal') == has(self.signalPorts)",message="signalPorts must be set when subflowCreation is signal, and only then"
// +kubebuilder:validation:XValidation:rule="!has(self.joinAfterBytes) || !has(self.subflowCreation) || self.subflowCreation == 'userspace'",message="joinAfterBytes holds back the joins the agent opens, which it does in userspace mode only: leave it unset with signal or guest"
// +kubebuilder:validation:XValidation:rule="!has(self.transparent) || !has(self.subflowCreation) || self.subflowCreation != 'guest'",message="transparent changes the pod's containers; in guest mode the programs run inside a VM, which it cannot reach: leave transparent unset"
type PodMPTCP struct {
	// subflowCreation says who creates extra subflows.
	// +optional
	// +kubebuilder:default=userspace
	SubflowCreation SubflowCreation `json:"subflowCreation,omitempty"`

	// signalPorts are the ports a server pod announces in signal mode, one
	// per extra subflow.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=7
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=65535
	SignalPorts []int32 `json:"signalPorts,omitempty"`
	// joinAfterBytes is how many bytes a connection the pod opens carries,
	// both ways together, before the agent opens its joins: a connection
	// that ends sooner (an RPC, a health check, a small object) stays on
	// its first subflow, where joins would cost a handshake each, a window
	// that starts small and reordering at the receiver, and one that
	// carries more gets its joins once it passes the threshold. 0 opens
	// them as soon as the connection is established. Userspace mode only,
	// where the agent opens the joins; unset there, 128Ki (the measurement
	// behind that choice: docs/subflows.md, "Small flows"). A change
	// reaches the pods' next connections.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(self).isInteger() && !quantity(self).isLessThan(quantity('0')) && !quantity(self).isGreaterThan(quantity('1Gi'))",message="joinAfterBytes must be a whole number of bytes from 0 to 1Gi, e.g. 256Ki"
	JoinAfterBytes *resource.Quantity `json:"joinAfterBytes,omitempty"`
	// dataChecksums keeps MPTCP's DSS checksums on in the selected pods
	// (RFC 8684 3.3.1; the pods' net.mptcp.checksum_enabled), the default:
	// every mapping of data is checked end to end, so bytes changed on the
	// way are caught instead of delivered. Linux 6.18 itself places data at
	// the wrong offset, now and then, on connections whose subflows deliver
	// out of order (docs/testing.md, "Data integrity"); checksums catch
	// that, and so a middlebox, a NIC or a datapath program that changes
	// bytes. A connection uses checksums when either end asks. On a caught
	// change the kernel resets the subflow that carried it and sends the
	// data again over another, or, while the connection has one subflow,
	// falls back to plain TCP. The cost is measured in docs/benchmarks.md
	// ("DSS checksums: cost"). false turns them off. With subflowCreation
	// guest the workload's own stack decides and this is not applied. The
	// agent exports each pod's checksum errors and fallbacks as metrics.
	// +optional
	// +kubebuilder:default=true
	DataChecksums *bool `json:"dataChecksums,omitempty"`
	// congestionControl is the TCP congestion control the agent sets in the
	// selected pods' network namespaces (their net.ipv4.tcp_congestion_control),
	// which their connections' subflows run unless a program picks its own.
	// cubic, the default, keeps transfers steady: under bbr every subflow of
	// a connection drains its queue for PROBE_RTT together about every 10 s,
	// and the connection stops 150-250 ms each time (docs/benchmarks.md,
	// "Steady state: longest stall"). Name another to keep it: the node must
	// have it (net.ipv4.tcp_available_congestion_control) and allow it in
	// pods' namespaces (net.ipv4.tcp_allowed_congestion_control), or the
	// agent skips the pod and says why in its node state. Not applied with
	// subflowCreation guest.
	// +optional
	// +kubebuilder:default=cubic
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:Pattern=`^[a-z0-9_]+$`
	CongestionControl string `json:"congestionControl,omitempty"`
	// transparent gives the selected pods' programs that do not open MPTCP
	// sockets themselves MPTCP, by changing each pod's containers when it
	// is created (inject, a mutating webhook) or with the node's socket
	// program (kernel, where the kernel allows it), or keeps Go's default
	// MPTCP listeners from them (off, the webhook); unset, the pods are
	// left as they are. Under inject and off, pods created before the
	// policy keep their spec until they are created again, and say so in
	// an event. The policy of highest precedence that sets it decides for
	// a pod. docs/transparent.md says which programs each covers.
	// +optional
	Transparent TransparentMPTCP `json:"transparent,omitempty"`
}

// Permission is an explicit admin choice.
// +kubebuilder:validation:Enum=Allowed;Forbidden
type Permission string

const (
	Allowed   Permission = "Allowed"
	Forbidden Permission = "Forbidden"
)

// MPTCPPolicySpec says which pods and which traffic (the selector chain) get
// which actions (the actor chain).
// +kubebuilder:validation:XValidation:rule="!has(self.blockedPaths) || self.spread.paths.all(p, !(p.name in self.blockedPaths))",message="blockedPaths must not name a path of spread.paths"
// +kubebuilder:validation:XValidation:rule="!has(self.blockedPaths) || !has(self.backupPaths) || self.backupPaths.all(p, !(p in self.blockedPaths))",message="blockedPaths must not name a path of backupPaths"
// +kubebuilder:validation:XValidation:rule="!has(self.backupPaths) || self.spread.paths.all(p, !(p.name in self.backupPaths))",message="backupPaths must not name a path of spread.paths"
// +kubebuilder:validation:XValidation:rule="!has(self.rateLimits) || !has(self.rateLimits.perPath) || self.rateLimits.perPath.all(r, self.spread.paths.exists(p, p.name == r.path) || (has(self.backupPaths) && r.path in self.backupPaths))",message="rateLimits.perPath must name paths of spread.paths or backupPaths"
// +kubebuilder:validation:XValidation:rule="self.headerRewriting == 'Allowed' || !has(self.backupPaths)",message="backupPaths rewrite MP_JOIN and MP_PRIO options and need headerRewriting: Allowed"
// +kubebuilder:validation:XValidation:rule="self.headerRewriting == 'Allowed' || !self.spread.paths.exists(p, has(p.role) && p.role == 'backup')",message="a spread path with role backup is flagged backup (MP_JOIN and MP_PRIO options) and needs headerRewriting: Allowed"
// +kubebuilder:validation:XValidation:rule="self.headerRewriting == 'Allowed' || !has(self.rateLimits) || self.rateLimits.mode != 'window'",message="rateLimits.mode window rewrites the TCP window and needs headerRewriting: Allowed"
// +kubebuilder:validation:XValidation:rule="size(self.spread.paths) + (has(self.backupPaths) ? size(self.backupPaths) : 0) <= 15",message="spread.paths and backupPaths name at most 15 paths together: a node steers over at most 15 paths"
type MPTCPPolicySpec struct {
	// priority decides between policies selecting the same pod: higher
	// first, then by name.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=-1000
	// +kubebuilder:validation:Maximum=1000
	Priority int32 `json:"priority"`

	// namespaceSelector selects the namespaces whose pods the policy covers.
	// It is required so that covering every namespace is written out as {}.
	// +required
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector"`

	// podSelector selects pods within those namespaces; unset selects all.
	// +optional
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`

	// traffic restricts the policy to some of the pods' traffic.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.cidrs) || self.cidrs.all(c, isCIDR(c))",messageExpression="'cidrs: ' + self.cidrs.filter(c, !isCIDR(c))[0] + ' is not a CIDR such as 10.0.0.0/8 (IPv4 networks in IPv4 form)'"
	// +kubebuilder:validation:XValidation:rule="!has(self.cidrs) || !has(self.family) || self.family == 'Any' || self.cidrs.all(c, !isCIDR(c) || cidr(c).ip().family() == (self.family == 'IPv4' ? 4 : 6))",message="every entry of cidrs must be of the address family given in family"
	// +kubebuilder:validation:XValidation:rule="!has(self.ports) || self.ports.all(p, !has(p.endPort) || p.endPort >= p.port)",message="ports: endPort must not be below port"
	Traffic *TrafficMatch `json:"traffic,omitempty"`

	// spread places subflows over named paths.
	// +required
	Spread Spread `json:"spread"`

	// backupPaths carry subflows only when no spread path is alive.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=15
	// +kubebuilder:validation:items:MaxLength=63
	BackupPaths []string `json:"backupPaths,omitempty"`

	// blockedPaths are refused: a join on them is answered with MP_TCPRST
	// "administratively prohibited".
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=15
	// +kubebuilder:validation:items:MaxLength=63
	BlockedPaths []string `json:"blockedPaths,omitempty"`

	// maxSubflows caps a connection's subflows, the first included; joins
	// beyond it are refused.
	// +optional
	// +kubebuilder:default=4
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8
	MaxSubflows int32 `json:"maxSubflows,omitempty"`

	// rateLimits caps connections, pods or paths.
	// +optional
	RateLimits *RateLimits `json:"rateLimits,omitempty"`

	// tenantPreferences says whether pods may reorder the spread paths with
	// the mptcp.io/preferred-paths annotation (narrowing only).
	// +optional
	// +kubebuilder:default=Forbidden
	TenantPreferences Permission `json:"tenantPreferences,omitempty"`

	// podMPTCP is the MPTCP configuration inside selected pods.
	// +optional
	// +kubebuilder:default={subflowCreation: userspace, dataChecksums: true}
	PodMPTCP PodMPTCP `json:"podMPTCP,omitempty"`

	// headerRewriting is the admin's explicit opt-in to rewriting tenant
	// packet headers at all (backup B bit, MP_PRIO, receive window).
	// +optional
	// +kubebuilder:default=Forbidden
	HeaderRewriting Permission `json:"headerRewriting,omitempty"`
}

// MPTCPPolicyStatus is aggregated by the controller from node states.
type MPTCPPolicyStatus struct {
	// observedGeneration is the generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// matchedPods is how many pods the policy governs (after priorities).
	// +optional
	MatchedPods int32 `json:"matchedPods"`

	// nodes is how many nodes run pods governed by the policy.
	// +optional
	Nodes int32 `json:"nodes"`

	// nodesReady is how many of them report this generation applied.
	// +optional
	NodesReady int32 `json:"nodesReady"`

	// conditions: Ready, Progressing, Degraded.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MPTCPPolicy gives the selected tenants' pods a multipath treatment.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=mpol,categories=mptcp
// +kubebuilder:printcolumn:name="Priority",type=integer,JSONPath=`.spec.priority`
// +kubebuilder:printcolumn:name="Pods",type=integer,JSONPath=`.status.matchedPods`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes`
// +kubebuilder:printcolumn:name="Nodes-Ready",type=integer,JSONPath=`.status.nodesReady`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MPTCPPolicy struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec MPTCPPolicySpec `json:"spec"`
	// +optional
	Status MPTCPPolicyStatus `json:"status,omitempty"`
}

// MPTCPPolicyList is a list of MPTCPPolicy.
//
// +kubebuilder:object:root=true
type MPTCPPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MPTCPPolicy `json:"items"`
}
