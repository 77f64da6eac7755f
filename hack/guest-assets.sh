#!/usr/bin/env bash
# Puts a guest kernel into one directory: a Debian cloud kernel
# (apt-get download, unpacked with dpkg-deb, never installed) and the modules
# its virtio network driver needs, with the order to load them in. The
# directory lives outside the clone and is keyed by package and version, so a
# machine fetches it once. The guests' initramfs is built by the tests
# (test/testbed/guest), from this tree. The Makefile keys the directory by a
# hash of this script too, so a changed list of modules is fetched again.
#
# usage: hack/guest-assets.sh <kernel package> <version> <dir>
set -euo pipefail

pkg=${1:?kernel package, e.g. linux-image-6.1.0-56-cloud-amd64}
version=${2:?package version}
dir=$(realpath -m "${3:?destination directory}")
if [[ -s "$dir/vmlinuz" && -s "$dir/modules/order" ]]; then
	exit 0
fi
release=${pkg#linux-image-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
download() { apt-get download -o APT::Sandbox::User=root "$pkg=$version" >/dev/null; }
if ! download 2>/dev/null; then
	apt-get update -qq
	download
fi
dpkg-deb -x ./*.deb root
mkdir -p out/modules
cp "root/boot/vmlinuz-$release" out/vmlinuz
# Each module after those it depends on (checked against its modinfo):
# virtio_net needs net_failover (failover) and the virtio PCI transport;
# inet_diag and tcp_diag answer sock_diag (ss), as a distribution would
# load them on demand.
loaded=" "
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci failover net_failover virtio_net inet_diag tcp_diag; do
	# A module a newer kernel has built in needs no loading.
	if grep -q "/$m.ko$" "root/lib/modules/$release/modules.builtin"; then
		loaded+="$m "
		continue
	fi
	f=$(find "root/lib/modules/$release" -name "$m.ko" -o -name "$m.ko.xz")
	if [[ -z "$f" ]]; then
		echo "$pkg $version has no module $m.ko" >&2
		exit 1
	fi
	# Newer kernels ship their modules compressed: the guest's init loads
	# them as they are, so they are decompressed here.
	if [[ "$f" == *.xz ]]; then
		xz -dc "$f" >"${f%.xz}"
		f=${f%.xz}
	fi
	for dep in $(strings "$f" | sed -n 's/^depends=//p' | tr , ' '); do
		if [[ "$loaded" != *" $dep "* ]]; then
			echo "$m.ko needs $dep, which is not loaded before it" >&2
			exit 1
		fi
	done
	loaded+="$m "
	cp "$f" out/modules/
	echo "$m.ko" >>out/modules/order
done
mkdir -p "$(dirname "$dir")"
rm -rf "$dir"
mv out "$dir"
