#!/usr/bin/env bash
# Puts Kubernetes binaries the tests need into one directory:
#   kube-apiserver, kubelet, kube-controller-manager, kube-scheduler
#                   built from the k8s.io/kubernetes Go module pinned in hack/tools/go.mod
#   etcd            the distribution's binary (Debian/Ubuntu package etcd-server)
# The directory lives outside the clone and is keyed by version, so a machine
# builds each binary once (a few minutes each) and every clone reuses it.
# envtest (KUBEBUILDER_ASSETS) takes kube-apiserver and etcd from it; the test
# bed's real nodes take the other three.
#
# usage: hack/envtest-assets.sh <kube-version> <dir> [binary...]
# (binaries default to kube-apiserver and etcd)
set -euo pipefail

version=${1:?kube version, e.g. v1.36.3}
dir=${2:?destination directory}
shift 2
binaries=("$@")
((${#binaries[@]})) || binaries=(kube-apiserver etcd)
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/hack/tools"

# The Makefile's KUBE_VERSION and the tools module must agree, or the cache key
# would lie about what it holds.
pinned=$(cd "$tools" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
if [[ "$pinned" != "$version" ]]; then
	echo "hack/tools/go.mod pins k8s.io/kubernetes $pinned but $version was asked for" >&2
	exit 1
fi

mkdir -p "$dir"

build() {
	local bin=$1
	[[ -x "$dir/$bin" ]] && return
	echo "building $bin $version into $dir (takes a few minutes, once per version)" >&2
	local minor=${version#v1.}
	minor=${minor%%.*}
	local pkg=k8s.io/component-base/version
	local ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	# Build to a temporary name and rename, so an interrupted build never
	# leaves a binary that looks cached.
	tmp="$dir/.$bin.$$"
	trap 'rm -f "$tmp"' EXIT
	local start=$SECONDS
	(cd "$tools" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$tmp" "k8s.io/kubernetes/cmd/$bin")
	mv "$tmp" "$dir/$bin"
	echo "built $bin in $((SECONDS - start)) s" >&2
	"$dir/$bin" --version >&2
}

link_etcd() {
	[[ -x "$dir/etcd" ]] && return
	local etcd
	etcd=$(command -v etcd || true)
	if [[ -z "$etcd" ]]; then
		echo "etcd not found: install the distribution package (apt-get install etcd-server)" >&2
		exit 1
	fi
	ln -sf "$etcd" "$dir/etcd"
}

for bin in "${binaries[@]}"; do
	case "$bin" in
	etcd) link_etcd ;;
	kube-apiserver | kubelet | kube-controller-manager | kube-scheduler) build "$bin" ;;
	*)
		echo "unknown binary $bin" >&2
		exit 1
		;;
	esac
done
