package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// image is one of the images `make images` builds: a single static Go binary
// on an empty base, or a C program with the shared libraries it loads.
type image struct {
	// name is the image's repository name under the registry and the
	// binary's name (/usr/local/bin/<name>).
	name string
	// pkg is the Go package of the binary, relative to the repository root.
	pkg string
	// test: the binary is pkg's test binary (go test -c).
	test bool
	// cSource, instead of pkg, is a C program (relative to the repository
	// root) built with clang against the build machine's C library, which
	// the image carries (libc.go).
	cSource string
	// user is the numeric uid:gid the image runs as. Numeric, so that the
	// kubelet can check runAsNonRoot without a passwd file.
	user string
	// description becomes the org.opencontainers.image.description label.
	description string
}

// allImages are built in this order and listed in images.json by name.
var allImages = []image{
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
		// What the preload library is for: a program linked against glibc
		// that never asks for MPTCP. Non-root, as the pods the webhook
		// changes usually are.
		name: "libc-client", cSource: "hack/libc-client/libc-client.c", user: nonRoot,
		description: "mptcp-operator test workload: a C client linked against glibc that knows nothing of MPTCP",
	},
	{
		// The chart's helm test: the conformance check (test/e2e/conformance)
		// run in a pod against the cluster it is in.
		name: "conformance", pkg: "./test/e2e/conformance", test: true, user: nonRoot,
		description: "mptcp-operator conformance check: spreads a pod's connections over two paths through the API server (helm test)",
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

// buildCommand says how the image's binary is built, for its history.
func (img image) buildCommand() string {
	if img.cSource != "" {
		return "clang " + img.cSource
	}
	if img.test {
		return "go test -c " + img.pkg
	}
	return "go build " + img.pkg
}

// build builds the image's binary into dir, stamped with version and
// revision, and lists the shared objects it loads.
func (img image) build(repo, arch, dir, version, revision string) (binary string, shared []fileEntry, err error) {
	if img.cSource == "" {
		binary, err = buildBinary(repo, img.pkg, arch, dir, img.name, version, revision, img.test)
		return binary, nil, err
	}
	if binary, err = buildCProgram(repo, img.cSource, dir, img.name); err != nil {
		return "", nil, err
	}
	shared, err = sharedObjects(binary)
	return binary, shared, err
}

// selectImages returns the images named in names, comma-separated, in
// build order; all of them when names is empty.
func selectImages(names string) ([]image, error) {
	if names == "" {
		return allImages, nil
	}
	want := map[string]bool{}
	for _, n := range strings.Split(names, ",") {
		want[n] = true
	}
	var out []image
	for _, img := range allImages {
		if want[img.name] {
			out = append(out, img)
			delete(want, img.name)
		}
	}
	if len(want) > 0 {
		return nil, fmt.Errorf("-images names no image called %v", slices.Sorted(maps.Keys(want)))
	}
	return out, nil
}
