package main

// image is one of the images `make images` builds: a single static Go binary
// on an empty base.
type image struct {
	// name is the image's repository name under the registry and the
	// binary's name (/usr/local/bin/<name>).
	name string
	// pkg is the Go package of the binary, relative to the repository root.
	pkg string
	// user is the numeric uid:gid the image runs as. Numeric, so that the
	// kubelet can check runAsNonRoot without a passwd file.
	user string
	// description becomes the org.opencontainers.image.description label.
	description string
}

// images are built in this order and listed in images.json by name.
var images = []image{
	{
		name: "controller", pkg: "./cmd/controller", user: nonRoot,
		description: "mptcp-operator controller: compiles MPTCPPaths and MPTCPPolicies into MPTCPNodeStates",
	},
	{
		// root: the agent holds CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN and
		// CAP_PERFMON and owns bpffs pins, /proc/sys/net and its state
		// directory as uid 0 (docs/agent.md#capabilities).
		name: "agent", pkg: "./cmd/agent", user: "0:0",
		description: "mptcp-operator node agent: enforces a node's MPTCPNodeState with TC programs",
	},
	{
		// root: the test workload binds low ports (the UDP echo on 7) and
		// writes its reports where a test tells it to.
		name: "traffic", pkg: "./hack/traffic", user: "0:0",
		description: "mptcp-operator test workload: hashed MPTCP or TCP streams and UDP probes",
	},
	{
		// The uid the kubelet's own pause image runs as.
		name: "pause", pkg: "./hack/pause", user: "65535:65535",
		description: "mptcp-operator test bed sandbox image: holds a pod's namespaces until SIGTERM",
	},
}

// nonRoot is the uid:gid of distroless's "nonroot", which Kubernetes
// operators commonly run as.
const nonRoot = "65532:65532"
