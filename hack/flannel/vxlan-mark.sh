#!/usr/bin/env bash
# Does an inner packet's fwmark steer the route lookup of its VXLAN outer
# packet? (research, wip/flannel; root; namespaces vxm-* only, removed on exit)
#
# The kernel builds the outer route's flowi4 in udp_tunnel_dst_lookup
# (net/ipv4/udp_tunnel_core.c), called by vxlan_xmit_one
# (drivers/net/vxlan/vxlan_core.c): fl4.flowi4_mark = skb->mark, and
# fl4.flowi4_oif = the FDB entry's remote_ifindex (NDA_IFINDEX, `bridge fdb
# ... via DEV`), else the VXLAN socket's bound device (an l3mdev's only).
# ip_tunnel_dst_cache_usable (include/net/ip_tunnels.h) skips the per-remote
# dst cache for a marked skb, so the lookup is per packet.
#
# A and B are joined by two links (paths 1 and 2); A's VTEP address routes
# over path 1 in main and over path 2 in table 102, which `fwmark 0x2`
# selects. A's vxlan device is made as flanneld makes flannel.1 (local VTEP
# address, `dev` its --iface, nolearning) with a unicast FDB entry:
#   plain      the entry has no `via` (flanneld's AddFDB sets no NDA_IFINDEX)
#   pinned     the entry says `via a1`: the outer lookup is bound to a1
# Packets: UDP from A itself (SO_MARK), and from a pod behind A, forwarded,
# marked by iptables in A's PREROUTING (as the agent's TC program would at
# the pod's veth). Counted: A's VXLAN packets out of a1 and a2.
set -euo pipefail
A=vxm-a B=vxm-b P=vxm-p
cleanup() { for n in $A $B $P; do ip netns del "$n" 2>/dev/null || true; done; }
trap cleanup EXIT

setup() { # $1: plain or pinned
	cleanup
	for n in $A $B $P; do
		ip netns add $n
		ip netns exec $n sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
		ip -n $n link set lo up
	done
	ip -n $A link add a1 type veth peer name b1 netns $B
	ip -n $A link add a2 type veth peer name b2 netns $B
	ip -n $A link add vp type veth peer name eth0 netns $P
	for n in $A $B; do ip netns exec $n sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0; done
	ip -n $A addr add 10.201.1.1/24 dev a1; ip -n $A addr add 10.201.2.1/24 dev a2; ip -n $A addr add 10.200.0.1/32 dev lo
	ip -n $B addr add 10.201.1.2/24 dev b1; ip -n $B addr add 10.201.2.2/24 dev b2; ip -n $B addr add 10.200.0.2/32 dev lo
	for l in a1 a2 vp; do ip -n $A link set $l up; done
	for l in b1 b2; do ip -n $B link set $l up; done
	ip -n $A route add 10.200.0.2/32 via 10.201.1.2 dev a1
	ip -n $A route add 10.200.0.2/32 via 10.201.2.2 dev a2 table 102
	ip -n $A rule add fwmark 0x2 lookup 102 pref 100
	ip -n $B route add 10.200.0.1/32 via 10.201.1.1 dev b1
	ip -n $A link add vx0 type vxlan id 1 local 10.200.0.1 dev a1 dstport 8472 nolearning
	if [[ $1 == pinned ]]; then
		bridge -n $A fdb append 00:00:00:00:00:00 dev vx0 dst 10.200.0.2 via a1
	else
		bridge -n $A fdb append 00:00:00:00:00:00 dev vx0 dst 10.200.0.2
	fi
	ip -n $B link add vx0 type vxlan id 1 local 10.200.0.2 remote 10.200.0.1 dstport 8472 nolearning
	ip -n $A addr add 192.168.50.1/24 dev vx0; ip -n $A link set vx0 up
	ip -n $B addr add 192.168.50.2/24 dev vx0; ip -n $B link set vx0 up
	ip -n $P addr add 10.244.1.5/32 dev eth0; ip -n $P link set eth0 up
	ip -n $P route add 169.254.1.1 dev eth0; ip -n $P route add default via 169.254.1.1 dev eth0
	ip -n $A addr add 169.254.1.1/32 dev vp; ip -n $A route add 10.244.1.5/32 dev vp
	ip netns exec $A sysctl -qw net.ipv4.conf.vp.proxy_arp=1
	ip -n $A route add 10.244.2.0/24 via 192.168.50.2 dev vx0
	ip -n $B route add 10.244.1.0/24 via 192.168.50.1 dev vx0
	ip -n $B addr add 10.244.2.1/32 dev lo
	for l in a1 a2; do ip netns exec $A iptables -t mangle -A POSTROUTING -o $l -p udp --dport 8472; done
	send $A 192.168.50.2 # resolves the overlay neighbour
}

# send NS DST [MARK]: five UDP datagrams from NS to DST, with SO_MARK.
send() {
	ip netns exec "$1" python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if len(sys.argv) > 2:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, int(sys.argv[2]))
for _ in range(5):
    s.sendto(b"x" * 100, (sys.argv[1], 9)); time.sleep(0.05)' "${@:2}"
}
out() { ip netns exec $A iptables -t mangle -L POSTROUTING -v -x -n | awk -v d="$1" '$6 == d {print $1}'; }
case_() { # label, command...
	local label=$1 p1 p2
	shift
	p1=$(out a1) p2=$(out a2)
	"$@"
	printf '  %-34s VXLAN packets out of a1: %d, a2: %d\n' "$label" $(($(out a1) - p1)) $(($(out a2) - p2))
}

for variant in plain pinned; do
	echo "FDB entry $variant:"
	setup $variant
	case_ "from A, unmarked" send $A 192.168.50.2
	case_ "from A, SO_MARK 0x2" send $A 192.168.50.2 2
	case_ "from the pod, unmarked" send $P 10.244.2.1
	ip netns exec $A iptables -t mangle -A PREROUTING -i vp -j MARK --set-mark 2
	case_ "from the pod, marked 0x2 at vp" send $P 10.244.2.1
	ip netns exec $A iptables -t mangle -D PREROUTING -i vp -j MARK --set-mark 2
	case_ "from the pod, mark removed" send $P 10.244.2.1
done
