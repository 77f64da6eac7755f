package nodes

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// cniBinDir is where Debian's containernetworking-plugins puts ptp,
// host-local and loopback.
const cniBinDir = "/usr/lib/cni"

// containerdConfig is the node's containerd configuration (version 2, what
// containerd 1.6 reads). Paths are the standard ones: the node's mount
// namespace makes them private. The CRI plugin:
//   - uses the sandbox image imported from an archive (nothing is pulled);
//   - restrict_oom_score_adj: the test's processes lack CAP_SYS_RESOURCE, so
//     runc cannot lower a sandbox's oom_score_adj to -998; containerd clamps it
//     to its own instead of failing the sandbox;
//   - no TCP service, and the streaming server (exec, attach, port-forward) on
//     the node's loopback with a free port: the kubelet, in the same
//     namespace, proxies the API server's streams to it;
//   - runc with cgroupfs, as the kubelet's cgroupDriver.
//
// The opt plugin's directory is moved into the node's state: its default,
// /opt/containerd, is the machine's.
func containerdConfig(l layout, sandboxImage, binDir string) string {
	return fmt.Sprintf(`version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %q
`, l.private("/opt"), sandboxImage, binDir, l.config("certs.d"))
}

// registryHosts is containerd's hosts.toml for a registry at host:port
// served over plain HTTP (Options.Registry).
func registryHosts(registry string) string {
	return fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+registry, "http://"+registry)
}

// cniConfig is the node's network: ptp gives each pod a veth pair, the pod's
// address on eth0 with a default route to the gateway, and on the node the
// gateway address (/32) on the host end and a /32 route to the pod, which is
// what the bed's pre-built pods look like and what the agent looks for
// (internal/agent LocatePod). host-local hands out addresses of the node's
// pod CIDR from first to last (the bed's pre-built pods, when the bed has
// any, keep the addresses below first). No masquerading: pods talk with
// their own addresses across the fabrics, which route pod CIDRs.
func cniConfig(cidr netip.Prefix, gateway, first, last netip.Addr) ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "testbed",
		"plugins": []any{map[string]any{
			"type":   "ptp",
			"mtu":    1500,
			"ipMasq": false,
			"ipam": map[string]any{
				"type": "host-local",
				"ranges": [][]map[string]string{{{
					"subnet": cidr.String(), "gateway": gateway.String(),
					"rangeStart": first.String(), "rangeEnd": last.String(),
				}}},
				"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
			},
		}},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// kubeletConfig is the node's KubeletConfiguration. Beyond the defaults:
//   - the machine runs cgroup v1 (hybrid), which kubelet 1.35+ refuses unless
//     failCgroupV1 is false; cgroupfs, as containerd's runc; the node's own
//     cgroup root, made beforehand under every hierarchy;
//   - oomScoreAdj 0: lowering its own score needs CAP_SYS_RESOURCE;
//   - image garbage collection off (threshold 100 %): imported images cannot
//     be pulled again, and the machine's disk is shared with other jobs;
//     eviction only at 1 % free for the same reason;
//   - no read-only port; authentication of its API by client certificate
//     (clientCAFile: the API server's kubelet client among them) or token
//     review, authorization by SubjectAccessReview, as kubeadm sets it;
//   - no cluster DNS (none runs): pods get the machine's resolv.conf.
func kubeletConfig(cgroupRoot, clientCAFile string) ([]byte, error) {
	conf := map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"failCgroupV1":             false,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               cgroupRoot,
		"containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
		"oomScoreAdj":              0,
		"failSwapOn":               false,
		"readOnlyPort":             0,
		"healthzBindAddress":       "127.0.0.1",
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": clientCAFile},
		},
		"authorization":               map[string]any{"mode": "Webhook"},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard": map[string]string{
			"memory.available":  "100Mi",
			"nodefs.available":  "1%",
			"imagefs.available": "1%",
			"nodefs.inodesFree": "1%",
		},
	}
	return yaml.Marshal(conf)
}

// writeFiles writes each file of the map with mode 0600.
func writeFiles(files map[string][]byte) error {
	for path, data := range files {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// labelFlag renders --node-labels.
func labelFlag(labels map[string]string) string {
	var kv []string
	for k, v := range labels {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return strings.Join(kv, ",")
}
