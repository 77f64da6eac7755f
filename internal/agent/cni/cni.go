// Package cni finds the node's CNI as the container runtime does (the first
// configuration file of its configuration directory), the mode it runs in
// (from the interfaces it makes on the node) and the skb->mark bits it
// uses, so that the agent can refuse to share them (docs/install.md, "CNIs").
package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// DefaultConfDir is where kubelets' container runtimes read the CNI
// configuration.
const DefaultConfDir = "/etc/cni/net.d"

// KubeProxyMarks are the bits kube-proxy marks packets with by default
// (0x4000 to masquerade, 0x8000 to drop): no CNI's, but on most nodes
// beside it, so a mark mask the agent suggests leaves them free.
const KubeProxyMarks uint32 = 0x0000c000

// Support is how far the project has proven a CNI and mode.
type Support string

const (
	// Tested: an end-to-end test runs it (docs/install.md's matrix).
	Tested Support = "tested"
	// Untested: the agent runs beside it, but no test proves steering
	// through it; the note says what is known.
	Untested Support = "untested"
	// Unknown: no configuration, or a plugin the agent does not know.
	Unknown Support = "unknown"
)

// Network is the CNI found on a node.
type Network struct {
	// Name is the CNI (calico, cilium, flannel, ptp, bridge,
	// ovn-kubernetes), or the first plugin's type when the agent does
	// not know it, or "" when no configuration was found.
	Name string `json:"name"`
	// Mode is how it carries pods' packets between nodes, as far as the
	// node's interfaces tell (routed, vxlan, ipip, geneve, host-gw,
	// native, ebpf).
	Mode string `json:"mode,omitempty"`
	// File is the configuration the runtime uses.
	File string `json:"file,omitempty"`
	// Marks are the skb->mark bits the CNI uses: its documented default,
	// or what the agent's settings declare for it, and EncryptionMarks.
	Marks uint32 `json:"marks"`
	// EncryptionMarks are the bits the CNI's encryption, found on, takes
	// besides its configured marks (Cilium's IPsec or WireGuard: all).
	EncryptionMarks uint32  `json:"encryptionMarks,omitempty"`
	Support         Support `json:"support"`
	// Note says what is known of the agent beside it.
	Note string `json:"note,omitempty"`
}

// String is the CNI and its mode, as a check's message names them.
func (n Network) String() string {
	switch {
	case n.Name == "":
		return "no CNI configuration"
	case n.Mode == "":
		return n.Name
	}
	return n.Name + " (" + n.Mode + ")"
}

// Host is what the node's own network shows of the CNI's mode and marks.
type Host struct {
	// Links are the node's interface names.
	Links []string
	// Addressed are the names of those that hold an address: a device
	// that a loaded module makes in every namespace (tunl0) is the
	// CNI's only once the CNI gives it one.
	Addressed []string
	// IPsec says an xfrm policy of the node matches packets by Cilium's
	// IPsec marks (CiliumIPsecMark): its IPsec is on, and keeps its key
	// index in the marks' 0xf000 bits.
	IPsec bool
}

// CiliumIPsecMark says whether an xfrm policy's mark (value, mask) is one of
// Cilium's: its encrypt (0x0e00) or decrypt (0x0d00) magic value in the
// 0x0f00 bits, which the mask covers. Other IPsec on the node (a
// route-based tunnel's marks) is no clash.
func CiliumIPsecMark(value, mask uint32) bool {
	const magic = 0x00000f00
	v := value & magic
	return mask&magic == magic && (v == 0x00000e00 || v == 0x00000d00)
}

// MayRouteInBPF says whether the CNI may send its pods' packets to a NIC
// itself, from a BPF program on the pod's interface, past the policy
// routing the agent steers with: Cilium, whose host-routing mode the node's
// interfaces do not tell, and Calico's eBPF data plane.
func (n Network) MayRouteInBPF() bool {
	return n.Name == "cilium" || (n.Name == "calico" && n.Mode == "ebpf")
}

// known are the CNIs the agent recognises by their plugin's type: their
// default marks and what the node's network says of their mode.
var known = map[string]struct {
	name  string
	marks uint32
	mode  func(h Host) string
}{
	// Calico's felix allocates its marks from IptablesMarkMask,
	// 0xffff0000 unless configured. Its eBPF data plane makes
	// bpfout.cali; with IPIP on, felix gives tunl0 an address.
	"calico": {"calico", 0xffff0000, func(h Host) string {
		switch {
		case has(h.Links, "bpfout.cali"):
			return "ebpf"
		case has(h.Links, "vxlan.calico"):
			return "vxlan"
		case has(h.Addressed, "tunl0"):
			return "ipip"
		}
		return "routed"
	}},
	// Cilium keeps a security identity in the upper 16 bits, its magic
	// values in 0x0f00 and a cluster id in the low 8 bits; it leaves
	// 0xf000 to kube-proxy's bits and others unless it encrypts: IPsec
	// keeps its key index there, and WireGuard (cilium_wg0) a magic
	// value's high bit.
	"cilium-cni": {"cilium", 0xffff0fff, func(h Host) string {
		switch {
		case has(h.Links, "cilium_vxlan"):
			return "vxlan"
		case has(h.Links, "cilium_geneve"):
			return "geneve"
		}
		return "native"
	}},
	"flannel": {"flannel", 0, func(h Host) string {
		if has(h.Links, "flannel.1") {
			return "vxlan"
		}
		return "host-gw"
	}},
	"ovn-k8s-cni-overlay": {"ovn-kubernetes", 0, fixedMode("geneve")},
	"ptp":                 {"ptp", 0, fixedMode("routed")},
	"bridge":              {"bridge", 0, fixedMode("bridge")},
}

func fixedMode(m string) func(Host) string { return func(Host) string { return m } }

// support is the project's matrix (docs/install.md, "CNIs"): what is
// proven, and what is known of the rest.
func support(name, mode string) (Support, string) {
	switch name {
	case "ptp":
		return Tested, "routed veths: the test bed's CNI"
	case "calico":
		if mode == "ebpf" {
			return Untested, "Calico's eBPF data plane redirects pods' packets past the policy routing the agent steers with"
		}
		if mode == "ipip" {
			return Untested, "a tunnel device takes its outer packets' route by its own fwmark, never the inner packet's, so every subflow inside IPIP leaves by one NIC; an IPPool with VXLAN, or none, spreads them"
		}
		if mode == "routed" {
			return Tested, "routed veths cali*: pods are found by their routes and steered by policy routing beside felix's iptables rules and NetworkPolicy; the agent's mark mask must stay outside felix's"
		}
		return Tested, "routed veths cali*: selected pods' subflows are encapsulated by vxlan.calico and their outer packets leave by their paths' NICs, so every path must route the nodes' VTEP addresses; the agent's mark mask must stay outside felix's"
	case "cilium":
		if mode == "vxlan" {
			return Tested, "VXLAN tunnel mode with enable-identity-mark=false: Cilium's tunnel device routes its outer packets by a mark of its own, so nic_egress readdresses the outer packet of a subflow of another path from this node's address on that path to the peer's there and sends it by that path's NIC; the peers' addresses are those of their MPTCPPeers, and the nodes' tunnel endpoints must be among them"
		}
		if mode == "geneve" {
			return Untested, "Cilium's tunnel device routes its outer packets by a mark of its own, and the datapath reads no Geneve header, so every subflow inside Geneve leaves by one NIC; VXLAN or native routing spreads them"
		}
		return Tested, "native routing with enable-identity-mark=false (the identity mark overwrites the agent's bits), legacy or eBPF host routing: eBPF host routing sends pods' packets to a NIC past the policy routing the agent steers with, so nic_egress sends subflows' on to their paths' NICs, and what arrives into pods skips their host-side veths (backup flags, ADD_ADDR blocking and ingress caps do not act); with encryption (IPsec or WireGuard) on, Cilium uses every mark bit and leaves the agent none"
	case "flannel", "bridge":
		if name == "flannel" && mode == "vxlan" {
			return Tested, "pods are found at their bridge ports; selected pods' subflows are encapsulated by flannel.1 and their outer packets leave by their paths' NICs, so every path must route the nodes' VTEP addresses"
		}
		return Tested, "pods are found at their bridge ports; where the node routes a peer's pods to the peer's address (flannel's host-gw), each path's table routes them to the peer's address on that path if the path's link holds it, else by the path's gateway (which must then route pod CIDRs); a node without selected pods is no peer, and its pods are reached only by the CNI's NIC where the gateways route no pod CIDR"
	case "ovn-kubernetes":
		return Untested, "pods' host-side veths are ports of OVS's br-int, where the agent's hooks run, but OVS, not the " +
			"node's routing, sends pods' packets into its Geneve tunnel, whose outer packets follow the mark only where OVN's " +
			"flows leave it: proven on no bed"
	case "":
		return Unknown, "the runtime would run no pod with a network"
	}
	return Unknown, "not a CNI the agent knows: its marks are unknown, so a clash cannot be found (set the agent's cni.marks)"
}

// Find reads the CNI configuration in dir as the container runtime does
// (libcni: the first of its .conf, .conflist and .json files by name that
// parses) and names the CNI, with the mode and marks that the node's
// network shows. An empty or missing directory is no error: it is a
// Network without a name. Cilium's encryption found on the node takes
// every mark bit whatever the configuration names: a meta plugin (Multus)
// first in the directory, or a file the CNI is rewriting, must not hide it;
// nor does a directory that cannot be read (the Network returned with the
// error still carries them).
func Find(dir string, h Host) (Network, error) {
	n, err := configured(dir, h)
	if h.IPsec || has(h.Links, "cilium_wg0") {
		n.EncryptionMarks = 0xffffffff
		n.Marks |= n.EncryptionMarks
	}
	return n, err
}

// configured is Find's CNI, as its configuration names it.
func configured(dir string, h Host) (Network, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	if err != nil {
		return Network{}, err
	}
	for _, file := range confFiles(dir, entries) {
		conf, ok := readConf(file)
		if !ok {
			continue
		}
		plugin, via := conf.mainPlugin(), ""
		if metaPlugins[plugin] {
			// The pod's interface is the delegate's, and so are the
			// marks; a delegate not found leaves the meta plugin's
			// name, unknown.
			if d := delegate(conf, dir, file, entries); d != "" {
				plugin, via = d, plugin
			}
		}
		n := Network{Name: plugin, File: file}
		// flannel's own plugin only delegates to bridge: a node whose
		// configuration names that delegate directly, beside flannel's
		// VXLAN device, runs flannel all the same.
		if plugin == "bridge" && has(h.Links, "flannel.1") {
			plugin = "flannel"
		}
		if k, ok := known[plugin]; ok {
			n.Name, n.Marks, n.Mode = k.name, k.marks, k.mode(h)
		}
		n.Support, n.Note = support(n.Name, n.Mode)
		if via != "" {
			n.Note = "through " + via + ": " + n.Note
		}
		return n, nil
	}
	n := Network{}
	n.Support, n.Note = support("", "")
	return n, nil
}

// confFiles are the configuration files of dir's entries, by name.
func confFiles(dir string, entries []os.DirEntry) []string {
	var out []string
	for _, e := range entries { // sorted by name
		switch filepath.Ext(e.Name()) {
		case ".conf", ".conflist", ".json":
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// metaPlugins make no interface of their own: each hands the pod's
// default network to a delegate CNI (Multus: its delegates, its
// clusterNetwork, or, unnamed, the next configuration of the directory).
var metaPlugins = map[string]bool{"multus": true, "multus-shim": true}

// conf is what the agent reads of a CNI configuration.
type conf struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Plugins []struct {
		Type string `json:"type"`
	} `json:"plugins"`
	// A meta plugin's delegates, the first the default network.
	Delegates      []conf `json:"delegates"`
	ClusterNetwork string `json:"clusterNetwork"`
}

// readConf reads and parses a configuration file.
func readConf(file string) (conf, bool) {
	var c conf
	b, err := os.ReadFile(file)
	if err != nil || json.Unmarshal(b, &c) != nil {
		return c, false
	}
	return c, c.mainPlugin() != ""
}

// mainPlugin is the type of a configuration's first plugin (a .conflist's
// plugins[0], a .conf's own type), which makes the pod's interface; later
// ones (portmap, bandwidth, tuning) only adjust it.
func (c conf) mainPlugin() string {
	if len(c.Plugins) > 0 {
		return c.Plugins[0].Type
	}
	return c.Type
}

// delegate is the main plugin of the CNI a meta plugin's configuration
// (file, in dir) hands the default network to: its first delegate; its
// clusterNetwork, a file or the name of a configuration in dir; or the
// first other configuration of dir after file that parses. "" when none
// is found.
func delegate(c conf, dir, file string, entries []os.DirEntry) string {
	if len(c.Delegates) > 0 {
		return c.Delegates[0].mainPlugin()
	}
	others := slices.DeleteFunc(confFiles(dir, entries), func(f string) bool { return f == file })
	if cn := c.ClusterNetwork; cn != "" {
		if filepath.IsAbs(cn) {
			// A path as Multus's container mounts the host's
			// directory (/host/etc/cni/net.d) may not be the
			// agent's: the file of that name in dir then.
			d, ok := readConf(cn)
			if !ok {
				d, _ = readConf(filepath.Join(dir, filepath.Base(cn)))
			}
			return d.mainPlugin()
		}
		for _, f := range others {
			if d, ok := readConf(f); ok && d.Name == cn {
				return d.mainPlugin()
			}
		}
		return ""
	}
	for _, f := range others {
		if d, ok := readConf(f); ok && f > file && !metaPlugins[d.mainPlugin()] {
			return d.mainPlugin()
		}
	}
	return ""
}

func has(links []string, name string) bool { return slices.Contains(links, name) }

// FreeMask suggests a mark mask of four bits that used leaves free, the
// highest such nibble, and kube-proxy's bits too when withKubeProxy; 0
// when there is none.
func FreeMask(used uint32, withKubeProxy bool) uint32 {
	if withKubeProxy {
		used |= KubeProxyMarks
	}
	for shift := 28; shift >= 0; shift -= 4 {
		if m := uint32(0xf) << shift; used&m == 0 {
			return m
		}
	}
	return 0
}

// ParseMarks reads a mark mask written as hexadecimal (0x00f00000) or
// decimal.
func ParseMarks(v string) (uint32, error) {
	m, err := strconv.ParseUint(strings.TrimSpace(v), 0, 32)
	if err != nil {
		return 0, fmt.Errorf("marks %q: want a 32-bit mask such as 0x00f00000", v)
	}
	return uint32(m), nil
}
