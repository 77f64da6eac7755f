package nodes_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// cilium-agent on the bed's real nodes (nodes.Cilium) in VXLAN mode (native
// routing runs with the operator's agents in TestCNI): pods get addresses of
// their Node's podCIDR (routed to cilium_host, each behind an lxc* veth with
// Cilium's programs), carry an MPTCP stream between nodes whole inside
// cilium_vxlan, and reach the API server at the kubernetes Service's
// address, the bed's relay; the machine's kernel settings that cilium-agent
// writes stay as they were.
func TestCilium(t *testing.T) {
	testbed.RequireRoot(t)
	nodes.RequireTools(t)
	dir := testutil.BuiltTool(t, "CILIUM", "cilium")
	images := testImages(t)
	for _, mode := range []string{"vxlan"} {
		t.Run(mode, func(t *testing.T) {
			before := machineSysctls(t)
			bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2})
			cp := startCluster(t)
			start := time.Now()
			c, err := nodes.Start(context.Background(), nodes.Options{
				Bed: bed, ControlPlane: cp, Assets: testenv.Assets(t),
				Images: images.All(), SandboxImage: images[nodes.PauseImage].Ref,
				Cilium: &nodes.Cilium{Dir: dir, Mode: mode},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if t.Failed() {
					for _, n := range c.Nodes {
						log := n.CiliumAgent.Output() + n.CiliumAgent.ErrOutput()
						if len(log) > 6000 {
							log = log[len(log)-6000:]
						}
						t.Logf("node %s: cilium-agent's log:\n%s", n.Name, log)
					}
				}
				if err := c.Stop(); err != nil {
					t.Errorf("stop the real nodes: %v", err)
				}
			})
			t.Logf("2 real nodes with cilium-agent (%s) Ready in %s", mode, time.Since(start).Round(100*time.Millisecond))
			for _, n := range c.Nodes {
				out := nsOut(t, n.Bed.NetNS, "ip", "-d", "link", "show")
				if !strings.Contains(out, "cilium_host") || mode == "vxlan" && !strings.Contains(out, "cilium_vxlan") {
					t.Fatalf("node %s: no cilium_host (or cilium_vxlan in VXLAN mode):\n%s", n.Name, out)
				}
			}
			// Node 1's packets to the server pod: in VXLAN mode all of them
			// inside cilium_vxlan's UDP, natively none; both through the
			// host's stack (host legacy routing), where iptables counts them.
			const size = 4 << 20
			d := podTransfer(t, cp, c, size, "cilium_host", func(server string) func() map[string]uint64 {
				return outCounters(t, c.Node(1).Bed.NetNS, map[string]string{
					"vxlan": "-p udp --dport 8472", "plain": "-d " + server,
				})
			})
			if mode == "vxlan" && (d["vxlan"] < size || d["plain"] != 0) || mode == "native" && (d["plain"] < size || d["vxlan"] != 0) {
				t.Fatalf("node 1 sent (bytes) %v during a %d-byte transfer in %s mode", d, size, mode)
			}
			// The server pod is an in-cluster client too: the kubernetes
			// Service's address is on the node's loopback.
			server := &corev1.Pod{}
			if err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: "traffic", Name: "server"}, server); err != nil {
				t.Fatal(err)
			}
			// podTransfer attached it (nodes.Cluster.AttachPod).
			assertPodReachesAPIServer(t, c.Node(2), server, &testbed.Pod{NetNS: bed.Name + "-pod-traffic-server"})
			// The agent compiled its datapath (with clang >= 18) and
			// attached it with tcx: the links are pinned in the node's
			// bpffs, the NICs' and the server pod's.
			for _, n := range c.Nodes {
				pins := bed.PinDir(n.Bed)
				want := []string{"cilium/devices/nic1/links/cil_from_netdev", "cilium/devices/nic2/links/cil_from_netdev"}
				if n == c.Node(2) {
					want = append(want, "cilium/endpoints/*/links/cil_from_container")
				}
				for _, w := range want {
					if m, _ := filepath.Glob(filepath.Join(pins, w)); len(m) == 0 {
						t.Errorf("node %s: no %s in its bpffs %s", n.Name, w, pins)
					}
				}
			}
			if after := machineSysctls(t); after != before {
				t.Fatalf("the machine's kernel settings changed: before\n%s\nafter\n%s", before, after)
			}
		})
	}
}

// machineSysctls reads the machine-wide settings cilium-agent writes.
func machineSysctls(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, k := range []string{"kernel/unprivileged_bpf_disabled", "kernel/timer_migration", "net/core/bpf_jit_enable"} {
		v, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(k + "=" + string(v))
	}
	return b.String()
}
