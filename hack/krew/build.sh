#!/usr/bin/env bash
# Builds the kubectl mptcp plugin (cmd/kubectl-mptcp) into BIN, and its krew
# package into OUT: the archive krew installs (the binary and LICENSE) and a
# krew plugin manifest naming the archive by its sha256, so that
#   kubectl krew install --manifest=OUT/mptcp.yaml --archive=OUT/kubectl-mptcp_linux_amd64.tar.gz
# installs it as `kubectl mptcp`. The manifest's uri is where a release would
# publish the archive (KREW_URI_BASE); krew checks the sha256 either way.
set -euo pipefail
bin=${1:?BIN}
out=${2:?OUT}
version=${3:?VERSION (the chart appVersion)}
base=${KREW_URI_BASE:-https://github.com/mptcp-operator/mptcp-operator/releases/download/v$version}
root=$(cd "$(dirname "$0")/../.." && pwd)
revision=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
stamp=-X\ github.com/mptcp-operator/mptcp-operator/internal/buildinfo.
mkdir -p "$bin" "$out"
(cd "$root" && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -buildvcs=false \
	-ldflags="-s -w ${stamp}version=$version ${stamp}revision=$revision" -o "$bin/kubectl-mptcp" ./cmd/kubectl-mptcp)
archive=kubectl-mptcp_linux_amd64.tar.gz
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$bin/kubectl-mptcp" "$root/LICENSE" "$stage/"
# Same bytes for the same binary: fixed owner, order and times.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$stage" -cf - kubectl-mptcp LICENSE | gzip -n >"$out/$archive"
sha=$(sha256sum "$out/$archive" | cut -d' ' -f1)
cat >"$out/mptcp.yaml" <<MANIFEST
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: mptcp
spec:
  version: v$version
  homepage: https://github.com/mptcp-operator/mptcp-operator
  shortDescription: Explain the MPTCP subflows of pods under mptcp-operator
  description: |
    kubectl mptcp status shows the operator's paths per node, node states,
    agents missing and policies; kubectl mptcp explain POD walks what decides
    a pod's subflows and names each step that limits them; kubectl mptcp
    subflows POD lists a pod's live connections and subflows. It works through
    the API server only (the agent's data through pods/exec in the agent's pod).
  platforms:
    - selector:
        matchLabels:
          os: linux
          arch: amd64
      uri: $base/$archive
      sha256: $sha
      bin: kubectl-mptcp
      files:
        - from: kubectl-mptcp
          to: .
        - from: LICENSE
          to: .
MANIFEST
echo "$bin/kubectl-mptcp ($version $revision)"
echo "$out/$archive sha256 $sha"
echo "$out/mptcp.yaml"
