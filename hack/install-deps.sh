#!/usr/bin/env bash
# Installs the Debian 12 packages the project needs, at pinned versions, when
# they are not installed yet: the BPF toolchain (its output is committed and
# diffed), the control plane's etcd, the test bed nodes' container runtime
# (containerd, runc, the CNI plugins ptp, host-local and loopback), and the
# tools the test bed drives (QEMU runs its VM guests, iptables their masquerade
# binding; binutils' strings reads the guest kernel's module dependencies;
# gcc and libc6-dev link flanneld statically, as flannel's own build does).
# `make test` and `make demo` call it, so the two README commands work on a
# new machine; it does nothing when everything is already there.
set -euo pipefail

packages=(
	clang=1:14.0-55.7~deb12u1
	llvm=1:14.0-55.7~deb12u1
	clang-format=1:14.0-55.7~deb12u1
	libbpf-dev=1:1.1.2-0+deb12u1
	etcd-server=3.4.23-4+b4
	containerd=1.6.20~ds1-1+deb12u3
	runc=1.1.5+ds1-1+deb12u1
	containernetworking-plugins=1.1.1+ds1-3+b5
	iproute2=6.1.0-3
	iperf3=3.12-1+deb12u2
	mptcpize=0.12-1
	tshark=4.0.17-0+deb12u3
	wireshark-common=4.0.17-0+deb12u3
	qemu-system-x86=1:7.2+dfsg-7+deb12u18+b3
	binutils=2.40-2
	iptables=1.8.9-2
	python3=3.11.2-1+b1
	gcc=4:12.2.0-3
	libc6-dev=2.36-9+deb12u14
	libpcap-dev=1.10.3-1
	libpcap0.8=1.10.3-1
	ipset=7.17-1
	xz-utils=5.4.1-1
	clang-19=1:19.1.7-3~deb12u1
)

missing=()
for p in "${packages[@]}"; do
	name=${p%%=*} want=${p#*=}
	have=$(dpkg-query -W -f='${Version}' "$name" 2>/dev/null || true)
	[[ "$have" == "$want" ]] || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
	exit 0
fi
if [[ $(id -u) != 0 ]]; then
	echo "missing packages (${missing[*]}): run as root, or install them with apt-get" >&2
	exit 1
fi
echo "installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# A pin apt no longer offers (Debian's security pocket replaces versions) is
# named with what apt offers instead, so that the pin is updated knowingly.
for p in "${missing[@]}"; do
	name=${p%%=*} want=${p#*=}
	offered=$(apt-cache madison "$name" | awk -F'|' '{gsub(/ /, "", $2); print $2}')
	if ! grep -qxF -- "$want" <<<"$offered"; then
		echo "hack/install-deps.sh pins $name $want, which apt does not offer (it offers: $(echo $offered))" >&2
		exit 1
	fi
done
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The Debian etcd and containerd packages may start system services; tests
# start their own, one containerd per bed node with its own socket and root,
# and never talk to a system one.
systemctl stop etcd 2>/dev/null || true
systemctl stop containerd 2>/dev/null || true
systemctl disable containerd 2>/dev/null || true
