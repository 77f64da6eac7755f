#!/usr/bin/env bash
# hack/kind.sh: mptcp-operator on kind, for machines with Docker.
#
#   make images && hack/kind.sh up   # cluster, fabrics, images, chart, examples
#   hack/kind.sh e2e                 # the conformance test on it (make kind-e2e: up, e2e, down)
#   hack/kind.sh down                # remove all of it
#   hack/kind.sh --dry-run up        # print the commands instead of running them
#
# `up` creates a kind cluster of one control plane and KIND_WORKERS workers,
# labelled mptcp.io/multipath=true (the chart's default agent.nodeSelector).
# Each worker gets KIND_NICS extra NICs, nic1..nicN, one per "fabric": a
# Docker network per path, with a router container that routes every node's
# pod CIDR to that node's address on the fabric, as the test bed's fabric
# namespaces do (docs/testbed.md). Each worker's nicK has a default route
# (high metric) via its fabric's router, which the agent takes as the path's
# gateway. The images of `make images` are loaded (kind load image-archive),
# the chart installed with pullPolicy Never, and examples/ applied: nic1 and
# nic2 are fabric-a and fabric-b.
#
# `e2e` runs test/e2e/conformance (TestInstalledOperator) against the cluster
# through its API server: a client pod on the first worker sends to a server
# pod on the second over MPTCP; the streams must arrive whole and the first
# worker's agent must have steered them over both fabrics. The same checks
# run on the test bed's real nodes in make test.
#
# Versions are pinned: kind $KIND_VERSION and its node image; the script
# refuses another kind. It needs docker, kind, kubectl, helm (make helm) and go.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# What a dry run prints goes to the script's stdout, also from inside $(...).
exec 4>&1

KIND=${KIND:-kind}
DOCKER=${DOCKER:-docker}
KUBECTL=${KUBECTL:-kubectl}
HELM=${HELM:-helm}
KIND_VERSION=${KIND_VERSION:-v0.29.0}
# The node image kind $KIND_VERSION was released with.
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.33.1}
KIND_CLUSTER=${KIND_CLUSTER:-mptcp}
KIND_WORKERS=${KIND_WORKERS:-2}
KIND_NICS=${KIND_NICS:-2}
# Fabric k is the /24 $KIND_FABRIC_PREFIX.$((100+k)).0; worker i is .$((10+i)) on it, the router .254.
KIND_FABRIC_PREFIX=${KIND_FABRIC_PREFIX:-10}
IMAGES_DIR=${IMAGES_DIR:-$root/_output/images}
KIND_WORKDIR=${KIND_WORKDIR:-$root/_output/kind}
GO=${GO:-go}
CHART=${CHART:-$root/charts/mptcp-operator}
NAMESPACE=${NAMESPACE:-mptcp-system}
DRY_RUN=${KIND_DRY_RUN:-}
# The images the cluster runs; kind brings its own pause image.
IMAGES=(controller agent traffic)

usage() {
	sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
}

# run prints or runs a command.
run() {
	if [[ -n $DRY_RUN ]]; then
		printf 'run:'
		printf ' %q' "$@"
		printf '\n'
		return 0
	fi
	"$@"
}

# query runs a command whose output the script needs (called as
# $(query ...)); a dry run prints it where run prints, and answers the
# placeholder $1.
query() {
	local placeholder=$1
	shift
	if [[ -n $DRY_RUN ]]; then
		{
			printf 'query:'
			printf ' %q' "$@"
			printf '\n'
		} >&4
		echo "$placeholder"
		return 0
	fi
	"$@" </dev/null
}

die() {
	echo "kind.sh: $*" >&2
	exit 1
}

workers() {
	local i
	for ((i = 1; i <= KIND_WORKERS; i++)); do
		if ((i == 1)); then echo "$KIND_CLUSTER-worker"; else echo "$KIND_CLUSTER-worker$i"; fi
	done
}

fabric_net() { echo "mptcp-$KIND_CLUSTER-fabric$1"; }
fabric_subnet() { echo "$KIND_FABRIC_PREFIX.$((100 + $1)).0.0/24"; }
fabric_addr() { echo "$KIND_FABRIC_PREFIX.$((100 + $1)).0.$2"; }
router() { echo "mptcp-$KIND_CLUSTER-fabric$1-router"; }

# render_config writes the kind cluster configuration.
render_config() {
	local config=$KIND_WORKDIR/kind-config.yaml i
	mkdir -p "$KIND_WORKDIR"
	{
		echo "# Written by hack/kind.sh: one control plane, $KIND_WORKERS workers for the agents."
		echo "kind: Cluster"
		echo "apiVersion: kind.x-k8s.io/v1alpha4"
		echo "name: $KIND_CLUSTER"
		echo "nodes:"
		echo "  - role: control-plane"
		echo "    image: $KIND_NODE_IMAGE"
		for ((i = 1; i <= KIND_WORKERS; i++)); do
			echo "  - role: worker"
			echo "    image: $KIND_NODE_IMAGE"
			echo "    labels:"
			echo "      mptcp.io/multipath: \"true\""
		done
	} >"$config"
	echo "$config"
}

check_tools() {
	[[ -n $DRY_RUN ]] && return 0
	local t
	for t in "$KIND" "$DOCKER" "$KUBECTL" "$HELM"; do
		command -v "$t" >/dev/null || die "$t not found (helm: make helm, then HELM=\$(make -s print-helm))"
	done
	local v
	v=$("$KIND" version | awk '{print $2}')
	[[ $v == "$KIND_VERSION" ]] || die "kind $v found, this script is pinned to $KIND_VERSION (go install sigs.k8s.io/kind@$KIND_VERSION)"
}

check_images() {
	local n
	for n in "${IMAGES[@]}"; do
		[[ -f $IMAGES_DIR/$n.tar ]] || die "$IMAGES_DIR/$n.tar is missing: run make images"
	done
}

create_cluster() {
	local config
	config=$(render_config)
	run "$KIND" create cluster --name "$KIND_CLUSTER" --config "$config" --wait 120s
}

# add_fabrics gives every worker one NIC per fabric, renamed nicK, and a
# router per fabric that knows every node's pod CIDR.
add_fabrics() {
	local k i node addr ifname cidr
	for ((k = 1; k <= KIND_NICS; k++)); do
		run "$DOCKER" network create --driver bridge --subnet "$(fabric_subnet "$k")" "$(fabric_net "$k")"
		run "$DOCKER" run -d --name "$(router "$k")" --network "$(fabric_net "$k")" --ip "$(fabric_addr "$k" 254)" \
			--cap-add NET_ADMIN --sysctl net.ipv4.ip_forward=1 --entrypoint sleep "$KIND_NODE_IMAGE" infinity
		i=0
		while read -r node; do
			i=$((i + 1))
			addr=$(fabric_addr "$k" $((10 + i)))
			run "$DOCKER" network connect --ip "$addr" "$(fabric_net "$k")" "$node"
			ifname=$(query "eth$k" "$DOCKER" exec "$node" sh -c "ip -o -4 addr show to $addr | cut -d' ' -f2")
			run "$DOCKER" exec "$node" ip link set "$ifname" down
			run "$DOCKER" exec "$node" ip link set "$ifname" name "nic$k"
			run "$DOCKER" exec "$node" ip link set "nic$k" up
			run "$DOCKER" exec "$node" ip route replace default via "$(fabric_addr "$k" 254)" dev "nic$k" metric $((1000 + k))
			cidr=$(query "10.244.$i.0/24" "$KUBECTL" get node "$node" -o 'jsonpath={.spec.podCIDR}')
			run "$DOCKER" exec "$(router "$k")" ip route replace "$cidr" via "$addr"
		done < <(workers)
	done
	# The agents pin under /sys/fs/bpf: it must be the node's bpffs.
	while read -r node; do
		run "$DOCKER" exec "$node" sh -c 'mountpoint -q /sys/fs/bpf || mount -t bpf bpffs /sys/fs/bpf'
	done < <(workers)
}

load_images() {
	local n
	for n in "${IMAGES[@]}"; do
		run "$KIND" load image-archive "$IMAGES_DIR/$n.tar" --name "$KIND_CLUSTER"
	done
}

install_chart() {
	run "$HELM" upgrade --install mptcp "$CHART" --namespace "$NAMESPACE" --create-namespace \
		--set controller.image.pullPolicy=Never --set agent.image.pullPolicy=Never --wait --timeout 5m
	run "$KUBECTL" apply -f "$root/examples/paths.yaml" -f "$root/examples/policy-spread.yaml"
}

# image_ref is the reference `make images` gave image $1: the "ref" of its
# object in images.json (flat objects, one per image). A dry run without
# images answers the chart's default.
image_ref() {
	local ref
	ref=$(tr -d '\n' <"$IMAGES_DIR/images.json" 2>/dev/null |
		grep -o "{[^{}]*\"name\": *\"$1\"[^{}]*}" |
		sed -n 's/.*"ref": *"\([^"]*\)".*/\1/p') || true
	if [[ -z $ref ]]; then
		[[ -n $DRY_RUN ]] || die "$IMAGES_DIR/images.json names no image $1: run make images"
		ref="ghcr.io/mptcp-operator/$1:$(sed -n 's/^appVersion: *"*\([^"]*\)"*$/\1/p' "$root/charts/mptcp-operator/Chart.yaml")"
	fi
	echo "$ref"
}

# conformance runs test/e2e/conformance on the cluster.
conformance() {
	local kubeconfig=$KIND_WORKDIR/kubeconfig traffic
	mkdir -p "$KIND_WORKDIR"
	if [[ -n $DRY_RUN ]]; then
		run "$KIND" get kubeconfig --name "$KIND_CLUSTER"
	else
		"$KIND" get kubeconfig --name "$KIND_CLUSTER" >"$kubeconfig"
	fi
	traffic=$(image_ref traffic)
	run "$GO" -C "$root" test -count=1 -v -run '^TestInstalledOperator$' ./test/e2e/conformance/ -args \
		-conformance.kubeconfig="$kubeconfig" -conformance.traffic-image="$traffic" -conformance.namespace="$NAMESPACE"
}

up() {
	check_tools
	check_images
	create_cluster
	add_fabrics
	load_images
	install_chart
	echo "kind.sh: cluster $KIND_CLUSTER is up; kubectl get mptcpnodestates shows the agents' state" >&2
}

down() {
	check_tools
	local k
	run "$KIND" delete cluster --name "$KIND_CLUSTER"
	for ((k = 1; k <= KIND_NICS; k++)); do
		run "$DOCKER" rm -f "$(router "$k")"
		run "$DOCKER" network rm "$(fabric_net "$k")"
	done
}

main() {
	while [[ $# -gt 0 ]]; do
		case $1 in
		--dry-run) DRY_RUN=1 ;;
		up) up ;;
		e2e) conformance ;;
		down) down ;;
		print-config) cat "$(render_config)" ;;
		print-image)
			shift
			image_ref "${1:?print-image needs an image name}"
			;;
		*) usage ;;
		esac
		shift
	done
}

[[ $# -gt 0 ]] || usage
main "$@"
