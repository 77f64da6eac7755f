package cni

import (
	"os"
	"path/filepath"
	"testing"
)

func writeConf(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The CNI is the first configuration by name that parses, as the runtime
// picks it; its mode comes from the node's interfaces and its marks from
// what the CNI is known to use.
func TestFindNamesTheCNIItsModeAndMarks(t *testing.T) {
	for name, tc := range map[string]struct {
		files map[string]string
		host  Host
		want  Network
	}{
		"calico over VXLAN": {
			files: map[string]string{"10-calico.conflist": `{"name":"k8s-pod-network","plugins":[{"type":"calico"},{"type":"bandwidth"},{"type":"portmap"}]}`},
			host:  Host{Links: []string{"lo", "eth0", "vxlan.calico", "cali1234"}},
			want:  Network{Name: "calico", Mode: "vxlan", Marks: 0xffff0000, Support: Tested},
		},
		"calico routed": {
			files: map[string]string{"10-calico.conflist": `{"name":"k8s-pod-network","plugins":[{"type":"calico"}]}`},
			host:  Host{Links: []string{"lo", "nic1", "cali1234"}},
			want:  Network{Name: "calico", Mode: "routed", Marks: 0xffff0000, Support: Tested},
		},
		"calico over IPIP: felix gave tunl0 an address": {
			files: map[string]string{"10-calico.conflist": `{"plugins":[{"type":"calico"}]}`},
			host:  Host{Links: []string{"lo", "tunl0", "cali1234"}, Addressed: []string{"lo", "tunl0"}},
			want:  Network{Name: "calico", Mode: "ipip", Marks: 0xffff0000, Support: Untested},
		},
		"calico routed beside the ipip module's tunl0": {
			files: map[string]string{"10-calico.conflist": `{"plugins":[{"type":"calico"}]}`},
			host:  Host{Links: []string{"lo", "tunl0", "cali1234"}, Addressed: []string{"lo"}},
			want:  Network{Name: "calico", Mode: "routed", Marks: 0xffff0000, Support: Tested},
		},
		"calico with the eBPF data plane": {
			files: map[string]string{"10-calico.conflist": `{"plugins":[{"type":"calico"}]}`},
			host:  Host{Links: []string{"bpfout.cali", "bpfin.cali"}},
			want:  Network{Name: "calico", Mode: "ebpf", Marks: 0xffff0000, Support: Untested},
		},
		"cilium in geneve tunnel mode": {
			files: map[string]string{"05-cilium.conflist": `{"plugins":[{"type":"cilium-cni"}]}`},
			host:  Host{Links: []string{"cilium_host", "cilium_net", "cilium_geneve"}},
			want:  Network{Name: "cilium", Mode: "geneve", Marks: 0xffff0fff, Support: Untested},
		},
		"cilium with WireGuard": {
			files: map[string]string{"05-cilium.conflist": `{"plugins":[{"type":"cilium-cni"}]}`},
			host:  Host{Links: []string{"cilium_host", "cilium_net", "cilium_wg0"}},
			want:  Network{Name: "cilium", Mode: "native", Marks: 0xffffffff, Support: Tested},
		},
		"cilium with IPsec": {
			files: map[string]string{"05-cilium.conflist": `{"plugins":[{"type":"cilium-cni"}]}`},
			host:  Host{Links: []string{"cilium_host", "cilium_net", "cilium_vxlan"}, IPsec: true},
			want:  Network{Name: "cilium", Mode: "vxlan", Marks: 0xffffffff, Support: Tested},
		},
		"flannel vxlan": {
			files: map[string]string{"10-flannel.conflist": `{"plugins":[{"type":"flannel","delegate":{"isDefaultGateway":true}},{"type":"portmap"}]}`},
			host:  Host{Links: []string{"cni0", "flannel.1"}},
			want:  Network{Name: "flannel", Mode: "vxlan", Support: Tested},
		},
		"flannel's bridge delegate written directly, beside flannel.1": {
			files: map[string]string{"10-flannel.conflist": `{"name":"cbr0","plugins":[{"type":"bridge","bridge":"cni0"}]}`},
			host:  Host{Links: []string{"cni0", "flannel.1"}},
			want:  Network{Name: "flannel", Mode: "vxlan", Support: Tested},
		},
		"a bridge without flannel": {
			files: map[string]string{"10-bridge.conflist": `{"plugins":[{"type":"bridge"}]}`},
			host:  Host{Links: []string{"cni0"}},
			want:  Network{Name: "bridge", Mode: "bridge", Support: Tested},
		},
		"flannel host-gw": {
			files: map[string]string{"10-flannel.conflist": `{"plugins":[{"type":"flannel"}]}`},
			host:  Host{Links: []string{"cni0"}},
			want:  Network{Name: "flannel", Mode: "host-gw", Support: Tested},
		},
		"ptp as a single .conf": {
			files: map[string]string{"10-ptp.conf": `{"type":"ptp","ipam":{"type":"host-local"}}`},
			want:  Network{Name: "ptp", Mode: "routed", Support: Tested},
		},
		"the first that parses, by name": {
			files: map[string]string{
				"00-notes.txt":         `{"plugins":[{"type":"calico"}]}`,
				"05-broken.conflist":   `{"plugins":[`,
				"06-empty.conflist":    `{"plugins":[]}`,
				"10-testbed.conflist":  `{"plugins":[{"type":"ptp"}]}`,
				"20-calico.conflist":   `{"plugins":[{"type":"calico"}]}`,
				"99-flannel.conflist/": ``,
			},
			want: Network{Name: "ptp", Mode: "routed", Support: Tested},
		},
		"a plugin the agent does not know": {
			files: map[string]string{"10-x.conflist": `{"plugins":[{"type":"weave-net"}]}`},
			want:  Network{Name: "weave-net", Support: Unknown},
		},
		"no configuration": {
			want: Network{Support: Unknown},
		},
		// Encryption is the node's, whatever the configuration names.
		"a meta plugin that names no delegate, beside Cilium's WireGuard": {
			files: map[string]string{"00-multus.conf": `{"type":"multus"}`},
			host:  Host{Links: []string{"cilium_host", "cilium_wg0"}},
			want:  Network{Name: "multus", Marks: 0xffffffff, Support: Unknown},
		},
		// Multus hands the default network to a delegate, whose marks count.
		"Multus with Calico as its delegate": {
			files: map[string]string{"00-multus.conf": `{"type":"multus","delegates":[{"name":"k8s-pod-network","plugins":[{"type":"calico"}]}]}`},
			host:  Host{Links: []string{"vxlan.calico"}},
			want:  Network{Name: "calico", Mode: "vxlan", Marks: 0xffff0000, Support: Tested},
		},
		"Multus naming its cluster network, beside another configuration": {
			files: map[string]string{
				"00-multus.conf":     `{"type":"multus","clusterNetwork":"k8s-pod-network"}`,
				"05-ptp.conflist":    `{"name":"other","plugins":[{"type":"ptp"}]}`,
				"10-calico.conflist": `{"name":"k8s-pod-network","plugins":[{"type":"calico"}]}`,
			},
			want: Network{Name: "calico", Mode: "routed", Marks: 0xffff0000, Support: Tested},
		},
		"Multus's cluster network as a path in its own container": {
			files: map[string]string{
				"00-multus.conf":     `{"type":"multus","clusterNetwork":"/host/etc/cni/net.d/10-calico.conflist"}`,
				"10-calico.conflist": `{"plugins":[{"type":"calico"}]}`,
			},
			want: Network{Name: "calico", Mode: "routed", Marks: 0xffff0000, Support: Tested},
		},
		"thick Multus, the next configuration its delegate, beside Cilium's WireGuard": {
			files: map[string]string{"00-multus.conf": `{"type":"multus-shim"}`, "05-cilium.conflist": `{"plugins":[{"type":"cilium-cni"}]}`},
			host:  Host{Links: []string{"cilium_host", "cilium_wg0"}},
			want:  Network{Name: "cilium", Mode: "native", Marks: 0xffffffff, Support: Tested},
		},
		"no configuration yet, beside Cilium's IPsec": {
			host: Host{IPsec: true},
			want: Network{Marks: 0xffffffff, Support: Unknown},
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for f, body := range tc.files {
				if f[len(f)-1] == '/' {
					if err := os.Mkdir(filepath.Join(dir, f), 0o755); err != nil {
						t.Fatal(err)
					}
					continue
				}
				writeConf(t, dir, f, body)
			}
			got, err := Find(dir, tc.host)
			if err != nil {
				t.Fatal(err)
			}
			if got.Name != tc.want.Name || got.Mode != tc.want.Mode || got.Marks != tc.want.Marks || got.Support != tc.want.Support {
				t.Errorf("found %+v, want %+v", got, tc.want)
			}
			if got.Note == "" {
				t.Errorf("found %+v without a note saying what is known", got)
			}
			if tc.want.Name != "" && filepath.Dir(got.File) != dir {
				t.Errorf("found in %q, want a file of %s", got.File, dir)
			}
		})
	}
	if n, err := Find(filepath.Join(t.TempDir(), "missing"), Host{}); err != nil || n.Name != "" {
		t.Errorf("a missing directory: %+v, %v; want no CNI and no error", n, err)
	}
}

// The suggested mask is four bits that neither the CNI nor, where it runs,
// kube-proxy use.
func TestFreeMaskLeavesTheCNIsAndKubeProxysBits(t *testing.T) {
	for _, tc := range []struct {
		used          uint32
		withKubeProxy bool
		want          uint32
	}{
		{0, true, 0xf0000000},
		{0xffff0000, true, 0x00000f00},
		{0xffff0fff, true, 0},
		{0xffff0fff, false, 0x0000f000},
		{0xffffffff, false, 0},
	} {
		if got := FreeMask(tc.used, tc.withKubeProxy); got != tc.want {
			t.Errorf("FreeMask(%#x, %v) = %#x, want %#x", tc.used, tc.withKubeProxy, got, tc.want)
		}
	}
}

func TestParseMarks(t *testing.T) {
	for in, want := range map[string]uint32{"0x00f00000": 0x00f00000, "0xFFFF0000": 0xffff0000, "3840": 0xf00, "0x0f00": 0xf00} {
		if got, err := ParseMarks(in); err != nil || got != want {
			t.Errorf("ParseMarks(%q) = %#x, %v; want %#x", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0x", "0x1ffffffff", "0x12zz", "-1", "f00"} {
		if got, err := ParseMarks(in); err == nil {
			t.Errorf("ParseMarks(%q) = %#x, want an error", in, got)
		}
	}
}

// Cilium's xfrm policies match its encrypt and decrypt magic values in the
// 0x0f00 bits (its key index above them); another tunnel's marks do not.
func TestCiliumIPsecMarks(t *testing.T) {
	for _, c := range []struct {
		value, mask uint32
		want        bool
	}{
		{0x00000e00, 0x0000ff00, true},
		{0x00003d00, 0x0000ff00, true},
		{0x00000e00, 0xffffff00, true},
		{0x00000e00, 0x00000e00, false},
		{0x0000002a, 0xffffffff, false},
		{0x00000400, 0x00000f00, false},
	} {
		if got := CiliumIPsecMark(c.value, c.mask); got != c.want {
			t.Errorf("CiliumIPsecMark(%#x, %#x) = %v, want %v", c.value, c.mask, got, c.want)
		}
	}
}

// A configuration directory that cannot be read is an error, and Cilium's
// encryption found on the node still takes every mark bit.
func TestEncryptionCountsWhenTheConfigurationCannotBeRead(t *testing.T) {
	notADir := filepath.Join(t.TempDir(), "file")
	writeConf(t, filepath.Dir(notADir), "file", "{}")
	n, err := Find(notADir, Host{Links: []string{"cilium_wg0"}})
	if err == nil || n.Marks != 0xffffffff || n.EncryptionMarks != 0xffffffff {
		t.Errorf("Find of a file: %+v, %v; want an error and every mark bit", n, err)
	}
}
