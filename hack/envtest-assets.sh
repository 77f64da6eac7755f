#!/usr/bin/env bash
# Puts the control-plane binaries envtest needs into one directory:
#   kube-apiserver  built from the k8s.io/kubernetes Go module pinned in hack/tools/go.mod
#   etcd            the distribution's binary (Debian/Ubuntu package etcd-server)
# The directory lives outside the clone and is keyed by version, so a machine
# builds kube-apiserver once (a few minutes) and every clone reuses it.
#
# usage: hack/envtest-assets.sh <kube-version> <dir>
set -euo pipefail

version=${1:?kube version, e.g. v1.36.3}
dir=${2:?destination directory}
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

if [[ ! -x "$dir/kube-apiserver" ]]; then
	echo "building kube-apiserver $version into $dir (takes a few minutes, once per version)" >&2
	minor=${version#v1.}
	minor=${minor%%.*}
	pkg=k8s.io/component-base/version
	ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	# Build to a temporary name and rename, so an interrupted build never
	# leaves a binary that looks cached.
	tmp="$dir/.kube-apiserver.$$"
	trap 'rm -f "$tmp"' EXIT
	(cd "$tools" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$tmp" k8s.io/kubernetes/cmd/kube-apiserver)
	mv "$tmp" "$dir/kube-apiserver"
fi

if [[ ! -x "$dir/etcd" ]]; then
	etcd=$(command -v etcd || true)
	if [[ -z "$etcd" ]]; then
		echo "etcd not found: install the distribution package (apt-get install etcd-server)" >&2
		exit 1
	fi
	ln -sf "$etcd" "$dir/etcd"
fi

"$dir/kube-apiserver" --version >&2
