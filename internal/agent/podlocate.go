package agent

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// NetNSDir is where named network namespaces live (ip netns; CNI plugins
// and the test bed put pods' namespaces there).
var NetNSDir = "/var/run/netns"

// LocatePod finds a local pod from its addresses (the first one): its
// host-side interface, a veth in this namespace, and the network namespace
// of the veth's peer.
//
// The route to the address (main table) answers first: when it leaves
// through a veth whose peer is in another namespace (routed veths: the
// `ptp` plugin, Calico, Cilium with per-endpoint routes), that veth is the
// pod's, as the CNI that wrote the route says; the namespace behind it need
// not hold the address (a VM's bridge binding gives it to the guest).
// Otherwise (a bridge, as flannel's cni0 and the `bridge` plugin lay out, or
// an interface that is no pod's, as Cilium's cilium_host) the pod is the
// namespace that holds the address on the peer of one of this namespace's
// veths, a port of that bridge when the route leads to one. A tenant can put
// any address on its own interface, so such a claim must be the only one:
// two namespaces holding the address are refused and reported, never
// resolved by a guess. A bridge's neighbour entries and forwarding database
// are not asked: any pod with CAP_NET_RAW (in the runtime's default set)
// writes them with one forged ARP reply.
//
// A namespace is named by a path: under NetNSDir first, else a process's
// /proc/<pid>/ns/net (a runtime that does not name namespaces).
func LocatePod(ips []netip.Addr) (LocatedPod, error) {
	return podLocator.locate(ips)
}

// The agent locates every selected pod at every reconcile (each spec
// change, link event and the 30 s resync), so what costs a pass over every
// namespace is kept between calls:
//   - which namespace path has which id (dedup by namespace inode, each
//     use checked against the id, rescanned when one is missing or stale);
//   - a snapshot of the addresses every veth peer holds, for the pods the
//     route does not find, so that locating N pods behind a bridge opens
//     each namespace once, not N times. It serves for claimsMaxAge (one
//     reconcile's pods) and is rebuilt early, at most every claimsMinAge,
//     when an address has no claim (a pod set up since). The claim chosen
//     is always checked again, fresh, before it is returned.
const (
	claimsMaxAge = time.Second
	claimsMinAge = 100 * time.Millisecond
)

var podLocator = &locator{now: time.Now}

type locator struct {
	mu  sync.Mutex
	now func() time.Time
	// host is the inode of the namespace the caches describe (ids of
	// namespaces are relative to it); any other empties them.
	host uint64
	// paths names namespaces by the id the host namespace gives them.
	paths map[int]string
	snap  *claimSnapshot
}

// claim is a host veth whose peer, in namespace nsid, holds an address.
type claim struct {
	hostIf    string
	hostIndex int
	// master is the bridge the host veth is a port of (0: none).
	master    int
	nsid      int
	peerIndex int
}

type claimSnapshot struct {
	built  time.Time
	byAddr map[netip.Addr][]claim
}

func (l *locator) locate(ips []netip.Addr) (LocatedPod, error) {
	if len(ips) == 0 {
		return LocatedPod{}, errors.New("no address")
	}
	addr := ips[0]
	host, err := netns.Get()
	if err != nil {
		return LocatedPod{}, fmt.Errorf("this network namespace: %w", err)
	}
	defer host.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(host), &st); err != nil {
		return LocatedPod{}, fmt.Errorf("this network namespace: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.host != st.Ino {
		l.host, l.paths, l.snap = st.Ino, nil, nil
	}

	var via netlink.Link
	var routeErr error
	routes, err := netlink.RouteGet(addr.AsSlice())
	switch {
	case err != nil:
		routeErr = err
	case len(routes) == 0:
		routeErr = errors.New("no route")
	default:
		if via, err = netlink.LinkByIndex(routes[0].LinkIndex); err != nil {
			routeErr = fmt.Errorf("its interface: %w", err)
		}
	}
	if via != nil && via.Type() == "veth" && via.Attrs().NetNsID >= 0 {
		attrs := via.Attrs()
		path, err := l.path(attrs.NetNsID)
		if err != nil {
			return LocatedPod{}, fmt.Errorf("the route to %s leads to veth %s, whose peer's namespace (netnsid %d) %w", addr, attrs.Name, attrs.NetNsID, err)
		}
		return LocatedPod{HostInterface: attrs.Name, NetNS: path}, nil
	}
	route := "the route to it fails: " + fmt.Sprint(routeErr)
	bridge := 0
	if via != nil {
		route = fmt.Sprintf("the route to it leads to %s, a %s", via.Attrs().Name, via.Type())
		if via.Type() == "bridge" {
			bridge = via.Attrs().Index
			route = fmt.Sprintf("the route to it leads to bridge %s", via.Attrs().Name)
		}
	}
	return l.fromClaims(host, addr, bridge, route)
}

// fromClaims finds the one namespace that holds addr on the peer of a host
// veth (a port of bridge, if not 0); route says where the route leads, for
// the reasons given.
func (l *locator) fromClaims(host netns.NsHandle, addr netip.Addr, bridge int, route string) (LocatedPod, error) {
	built := false
	if l.snap == nil || l.now().Sub(l.snap.built) >= claimsMaxAge {
		if err := l.rebuild(host); err != nil {
			return LocatedPod{}, err
		}
		built = true
	}
	for {
		loc, stale, err := l.claimed(host, addr, bridge, route)
		// A snapshot from an earlier call may miss what changed since:
		// taken again once, at once if it proved stale, else if it is
		// old enough (a pod that is not there costs one snapshot per
		// claimsMinAge, however many such pods are located).
		if err == nil || built || !stale && l.now().Sub(l.snap.built) < claimsMinAge {
			return loc, err
		}
		if err := l.rebuild(host); err != nil {
			return LocatedPod{}, err
		}
		built = true
	}
}

// claimed decides from the snapshot; stale says the claim it chose no
// longer holds.
func (l *locator) claimed(host netns.NsHandle, addr netip.Addr, bridge int, route string) (_ LocatedPod, stale bool, _ error) {
	cs := slices.DeleteFunc(slices.Clone(l.snap.byAddr[addr]), func(c claim) bool { return bridge != 0 && c.master != bridge })
	where := "a veth's peer"
	if bridge != 0 {
		where = "the peer of a port of that bridge"
	}
	switch len(cs) {
	case 0:
		return LocatedPod{}, false, fmt.Errorf("no network namespace holds %s on %s (%s)", addr, where, route)
	case 1:
	default:
		var names []string
		for _, c := range cs {
			names = append(names, c.hostIf)
		}
		return LocatedPod{}, false, fmt.Errorf("%s is held by the namespaces behind %s: more than one claims it, so none is taken for the pod (%s)",
			addr, strings.Join(names, ", "), route)
	}
	c := cs[0]
	// The snapshot may be older than the namespace's last change.
	path, err := l.path(c.nsid)
	if err == nil {
		err = l.check(host, path, c, addr)
	}
	if err != nil {
		return LocatedPod{}, true, fmt.Errorf("%s was held by the namespace behind %s, which %w (%s)", addr, c.hostIf, err, route)
	}
	return LocatedPod{HostInterface: c.hostIf, NetNS: path}, false, nil
}

// rebuild takes a new snapshot of the claims of every host veth whose peer
// is in another namespace.
func (l *locator) rebuild(host netns.NsHandle) error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("listing links: %w", err)
	}
	s := &claimSnapshot{built: l.now(), byAddr: map[netip.Addr][]claim{}}
	byNS := map[int][]netlink.Link{}
	for _, link := range links {
		if a := link.Attrs(); link.Type() == "veth" && a.NetNsID >= 0 {
			byNS[a.NetNsID] = append(byNS[a.NetNsID], link)
		}
	}
	for _, nsid := range slices.Sorted(maps.Keys(byNS)) {
		path, err := l.path(nsid)
		if err != nil {
			// Not a namespace a path can be given for: no pod's.
			continue
		}
		view, err := readNS(host, path, nsid)
		if err != nil {
			continue
		}
		for _, v := range byNS[nsid] {
			a := v.Attrs()
			if !view.peerOf(a.Index, a.ParentIndex) {
				continue
			}
			for _, ip := range view.addrs[a.ParentIndex] {
				s.byAddr[ip] = append(s.byAddr[ip], claim{hostIf: a.Name, hostIndex: a.Index, master: a.MasterIndex, nsid: nsid, peerIndex: a.ParentIndex})
			}
		}
	}
	l.snap = s
	return nil
}

// check says whether c still holds: the host veth with its peer in the
// namespace at path, which holds addr on it.
func (l *locator) check(host netns.NsHandle, path string, c claim, addr netip.Addr) error {
	link, err := netlink.LinkByIndex(c.hostIndex)
	if err != nil {
		return fmt.Errorf("is gone (%w)", err)
	}
	if a := link.Attrs(); a.Name != c.hostIf || a.NetNsID != c.nsid || a.ParentIndex != c.peerIndex || a.MasterIndex != c.master {
		return errors.New("has changed")
	}
	view, err := readNS(host, path, c.nsid)
	if err != nil {
		return err
	}
	if !view.peerOf(c.hostIndex, c.peerIndex) || !slices.Contains(view.addrs[c.peerIndex], addr) {
		return errors.New("no longer holds it")
	}
	return nil
}

// nsView is what a pod's namespace holds: its links, their addresses, and
// the id it gives the host namespace.
type nsView struct {
	links  map[int]netlink.Link
	addrs  map[int][]netip.Addr
	hostID int
}

// peerOf says whether link index in this namespace is the peer of host
// veth hostIndex: a veth whose own peer is that one, in the host namespace.
func (v nsView) peerOf(hostIndex, index int) bool {
	link, ok := v.links[index]
	if !ok || link.Type() != "veth" {
		return false
	}
	a := link.Attrs()
	return v.hostID >= 0 && a.NetNsID == v.hostID && a.ParentIndex == hostIndex
}

// readNS reads the namespace at path, which the host namespace must know
// as nsid (a path whose namespace changed is refused).
func readNS(host netns.NsHandle, path string, nsid int) (nsView, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nsView{}, fmt.Errorf("cannot be opened (%w)", err)
	}
	defer ns.Close()
	if id, err := netlink.GetNetNsIdByFd(int(ns)); err != nil || id != nsid {
		return nsView{}, fmt.Errorf("is no longer at %s", path)
	}
	// A netlink socket opened in the namespace reads it from here; the
	// thread that opens it goes back to its own namespace at once.
	var h *netlink.Handle
	if err := netnsutil.DoFD(int(ns), func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	}); err != nil {
		return nsView{}, fmt.Errorf("cannot be read (%w)", err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nsView{}, fmt.Errorf("cannot be read (%w)", err)
	}
	// After the link dump, which gives the host namespace an id there
	// if it had none.
	hostID, err := h.GetNetNsIdByFd(int(host))
	if err != nil {
		return nsView{}, fmt.Errorf("cannot be read (%w)", err)
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nsView{}, fmt.Errorf("cannot be read (%w)", err)
	}
	v := nsView{links: map[int]netlink.Link{}, addrs: map[int][]netip.Addr{}, hostID: hostID}
	for _, link := range links {
		v.links[link.Attrs().Index] = link
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			v.addrs[a.LinkIndex] = append(v.addrs[a.LinkIndex], ip.Unmap())
		}
	}
	return v, nil
}

// path is the path of the namespace the host namespace knows as id.
func (l *locator) path(id int) (string, error) {
	if p, ok := l.paths[id]; ok && nsid(p) == id {
		return p, nil
	}
	l.rescan()
	if p, ok := l.paths[id]; ok {
		return p, nil
	}
	return "", fmt.Errorf("is named neither under %s nor by a process", NetNSDir)
}

// rescan names every namespace this one has an id for: those under
// NetNSDir first, then the processes'. Each namespace (inode) is opened
// once, however many processes share it.
func (l *locator) rescan() {
	l.paths = map[int]string{}
	seen := map[uint64]bool{l.host: true}
	named, _ := filepath.Glob(filepath.Join(NetNSDir, "*"))
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range append(named, procs...) {
		ino, ok := nsInode(p)
		if !ok || seen[ino] {
			continue
		}
		seen[ino] = true
		if id := nsid(p); id >= 0 {
			l.paths[id] = p
		}
	}
}

// nsInode is the inode of the namespace at path: a process's link reads
// "net:[inode]" without opening it; a named one is a bind mount of it.
func nsInode(path string) (uint64, bool) {
	if target, err := os.Readlink(path); err == nil {
		if s, ok := strings.CutPrefix(target, "net:["); ok {
			ino, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64)
			return ino, err == nil
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, false
	}
	return st.Ino, true
}

// nsid is the id this namespace gives the namespace at path, or -1.
func nsid(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	id, err := netlink.GetNetNsIdByFd(int(f.Fd()))
	if err != nil {
		return -1
	}
	return id
}
