package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/compile"
	"github.com/mptcp-operator/mptcp-operator/internal/socketmptcp"
	"github.com/mptcp-operator/mptcp-operator/internal/transparent"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/release"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

const (
	tenantNS   = "tenant"
	tenantPort = 5301
)

// tenantLabels select a namespace's pods for examples/policy-spread.yaml.
var tenantLabels = map[string]string{"mptcp.io/tenant": "enabled"}

// processStatus reads the fields of /proc/<pid>/status.
func processStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

func capMask(t *testing.T, hex string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// requireChartPrivileges checks what the kernel says the chart's pods hold:
// each agent exactly its declared capabilities (CAP_NET_ADMIN 12,
// CAP_SYS_ADMIN 21, CAP_PERFMON 38, CAP_BPF 39) in its effective,
// permitted and bounding sets, none beyond them anywhere, no new
// privileges, the runtime's seccomp filter; each controller none at all,
// as the image's non-root user.
func requireChartPrivileges(t *testing.T, cb *chartBed) {
	t.Helper()
	const declared = 1<<12 | 1<<21 | 1<<38 | 1<<39
	for _, n := range cb.bed.Nodes {
		st := processStatus(t, cb.agentPID(t, n))
		for _, set := range []string{"CapEff", "CapPrm", "CapBnd"} {
			if m := capMask(t, st[set]); m != declared {
				t.Errorf("agent on %s: %s %016x, want exactly the declared %016x", framework.NodeName(n), set, m, uint64(declared))
			}
		}
		for _, set := range []string{"CapInh", "CapAmb"} {
			if m := capMask(t, st[set]); m&^declared != 0 {
				t.Errorf("agent on %s: %s %016x holds more than the declared capabilities", framework.NodeName(n), set, m)
			}
		}
		if st["NoNewPrivs"] != "1" || st["Seccomp"] != "2" {
			t.Errorf("agent on %s: NoNewPrivs %s, Seccomp %s; want 1 and 2 (filter)", framework.NodeName(n), st["NoNewPrivs"], st["Seccomp"])
		}
	}
	var pods corev1.PodList
	if err := cb.c.List(context.Background(), &pods, client.InNamespace(release.Namespace),
		client.MatchingLabels{"app.kubernetes.io/component": "controller"}); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Fatal("no controller pod")
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		for _, pid := range cb.nodes.NodeOf(p).PodPIDs(p) {
			st := processStatus(t, pid)
			if !strings.HasPrefix(st["Name"], "controller") {
				continue // the sandbox
			}
			if capMask(t, st["CapEff"]) != 0 || capMask(t, st["CapPrm"]) != 0 || !strings.HasPrefix(st["Uid"], "65532") {
				t.Errorf("controller %s: CapEff %s, CapPrm %s, Uid %s; want no capability, uid 65532", p.Name, st["CapEff"], st["CapPrm"], st["Uid"])
			}
		}
	}
}

// footprintPaths are where node n keeps what the agent writes, as the
// machine sees them.
func (cb *chartBed) footprintPaths(n *testbed.Node) framework.FootprintPaths {
	return framework.FootprintPaths{BPFFS: cb.bed.PinDir(n), State: filepath.Join(cb.nodes.Node(n.Index).Dir, "run", "mptcp-operator")}
}

// footprints reads every node's footprint with its pods'.
func (cb *chartBed) footprints(t *testing.T) framework.Footprint {
	t.Helper()
	all := framework.Footprint{}
	for _, n := range cb.bed.Nodes {
		f, err := framework.TakeFootprint(cb.bed, n, cb.footprintPaths(n), n.Pods)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range f {
			all[k] = v
		}
	}
	return all
}

// waitLinkLocal waits until the host-side veth of every pod has its IPv6
// link-local address, past duplicate address detection: the kernel adds
// its routes then, which a footprint taken earlier would not show.
func waitLinkLocal(t *testing.T, bed *testbed.Bed) {
	t.Helper()
	for _, n := range bed.Nodes {
		for _, p := range n.Pods {
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				out, err := bed.Command(n.NetNS, "ip", "-6", "-o", "addr", "show", "dev", p.HostIf, "scope", "link").CombinedOutput()
				if err == nil && strings.Contains(string(out), "fe80::") && !strings.Contains(string(out), "tentative") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: no settled link-local address on %s: %s (%v)", p, p.HostIf, out, err)
				}
			}
		}
	}
}

// serverPod is a tenant pod on node n that serves MPTCP connections, held
// until the agent configured it.
func (cb *chartBed) serverPod(n *testbed.Node) *corev1.Pod {
	return nodes.TrafficPod(tenantNS, fmt.Sprintf("server%d", n.Index), framework.NodeName(n), cb.images[nodes.TrafficImage].Ref,
		map[string]string{"app": "server"}, []corev1.EnvVar{nodes.PodIPEnv},
		"serve", "-listen", fmt.Sprintf("$(POD_IP):%d", tenantPort), "-mptcp", "-warmup", "0s", "-window", "2s")
}

// ownSettings gives a pod's namespace MPTCP settings of its own, none the
// kernel's default: what its owner, its runtime or another tool may have
// set before the product came. Uninstalling must put them back as they
// were.
func ownSettings(t *testing.T, bed *testbed.Bed, p *testbed.Pod) {
	t.Helper()
	for _, args := range [][]string{
		{"sysctl", "-w", "net.mptcp.checksum_enabled=1"},
		{"ip", "mptcp", "limits", "set", "subflows", "3", "add_addr_accepted", "1"},
		{"ip", "mptcp", "endpoint", "add", p.Addr.String(), "id", "7", "subflow"},
	} {
		if out, err := bed.Command(p.NetNS, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %s: %v: %s", p, strings.Join(args, " "), err, out)
		}
	}
}

// An admin installs the chart (helm install, this tree's images imported on
// the nodes, pullPolicy Never: nothing else) on a cluster of real nodes; the
// controller and an agent per node come up as the chart's pods, each with
// only the privileges the chart declares. examples/ is applied; tenant pods
// created from Pod specs run the traffic image, held by their init
// container until their node's agent has configured them. MPTCP
// connections in both directions between the two nodes' pods are spread,
// one subflow per NIC, the same NIC at both ends, as captures show, and every
// stream arrives as it was sent. Then helm uninstall: the agents see their
// DaemonSet deleted and take everything away, so that each node, and the
// network namespace of each pod the agents configured, is as it was before
// the install: rules, routes, qdiscs, filters, TCX programs, every net.*
// sysctl, MPTCP endpoints and limits (a pod's own, not the kernel's
// defaults), pins and state files.
func testChartInstalledAsAnAdminDoesSpreadsAndUninstallsWithoutATrace(t *testing.T) {
	cb := startChartBed(t, testbed.Config{Nodes: 2, NICs: 2, LinkRate: "100mbit"}, testImages(t)[nodes.ConformanceImage])
	ctx := background(t)
	servers := cb.tenantServers(t)
	for _, n := range cb.bed.Nodes {
		cb.attach(t, servers[n.Index])
	}
	ownSettings(t, cb.bed, cb.bed.Pod(2, 1))
	waitLinkLocal(t, cb.bed)
	before := cb.footprints(t)
	// The kubelets run the servers' sandboxes, but their workloads wait
	// for the agent's gate, and no agent runs yet.
	for _, s := range servers {
		if err := nodes.WaitStarted(ctx, cb.c, s, time.Second); err == nil {
			t.Errorf("server %s started its workload before any agent ran", s.Name)
		}
	}

	cb.install(t, release.Chart(), cb.images)
	requireChartPrivileges(t, cb)
	cb.applyExamples(t, servers)
	// Each node's client pod sends to the other node's server.
	analysis, sent := cb.crossTransfer(t, servers)
	requireSpread(t, analysis, sent, "installed with the chart")
	requireNodeStatesOfExamples(t, cb, servers)
	requireTransparentClientsGetMPTCP(t, cb, servers[2])
	// The checks hack/kind.sh runs on kind, through the API server alone,
	// as the chart's helm test: a pod of the conformance image.
	if out, err := cb.helm.Test(ctx); err != nil {
		t.Errorf("helm test: %v", err)
	} else if !strings.Contains(out, "--- PASS: TestInstalledOperator") || !regexp.MustCompile(`Phase:\s+Succeeded`).MatchString(out) {
		t.Errorf("helm test passed without the conformance check's pass in its log:\n%s", out)
	} else {
		t.Logf("helm test: the conformance check passed in a pod")
	}

	// What the footprint must see go: the agents' rules, programs, pins,
	// sysctls, and the pods' path manager.
	installed := before.Diff(cb.footprints(t), nil)
	for _, want := range []string{"fwmark", "pod_egress", "nic_ingress", "mptcp-operator/", "src_valid_mark = 1", "net.mptcp.path_manager = userspace"} {
		if !strings.Contains(installed, want) {
			t.Errorf("the footprint of the installed product lacks %q; it shows:\n%s", want, installed)
		}
	}

	cb.uninstall(t)
	if diff := before.Diff(cb.footprints(t), nil); diff != "" {
		t.Errorf("helm uninstall left the nodes changed (- before the install, + after the uninstall):\n%s", diff)
	}
}

// requireTransparentClientsGetMPTCP: in a namespace that opted in to the
// webhook, a policy with podMPTCP.transparent inject selects a Go client
// that never asks for MPTCP (traffic send -go-default) and a C client
// linked against glibc that never asks either. The chart's webhook,
// served by the controller with the certificate it issued, changes the
// pods as the API server admits them; the kubelet runs the init container
// that installs the preload library (as a non-root user, from the agent's
// image); and the clients' connections to the other node's server are
// MPTCP, arrive whole, and have one subflow on each NIC in the captures.
func requireTransparentClientsGetMPTCP(t *testing.T, cb *chartBed, server *corev1.Pod) {
	t.Helper()
	ctx := background(t)
	const ns = "transparent"
	cb.namespace(t, ns, map[string]string{"mptcp.io/transparent": "enabled"})
	if err := nodes.AllowAwait(ctx, cb.c, ns); err != nil {
		t.Fatal(err)
	}
	// Created before the policy: it keeps its spec, and is told why.
	early := nodes.TrafficPod(ns, "before-policy", framework.NodeName(cb.bed.Node(1)), cb.images[nodes.TrafficImage].Ref, nil,
		[]corev1.EnvVar{nodes.PodIPEnv}, "serve", "-listen", fmt.Sprintf("$(POD_IP):%d", tenantPort))
	early.Spec.InitContainers, early.Spec.ReadinessGates = nil, nil
	if err := cb.c.Create(ctx, early); err != nil {
		t.Fatal(err)
	}
	if err := nodes.WaitStarted(ctx, cb.c, early, time.Minute); err != nil {
		t.Fatal(err)
	}
	policy := &mptcpv1alpha1.MPTCPPolicy{ObjectMeta: metav1.ObjectMeta{Name: "transparent-inject"}, Spec: mptcpv1alpha1.MPTCPPolicySpec{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
		Spread:            mptcpv1alpha1.Spread{Paths: []mptcpv1alpha1.WeightedPath{{Name: "fabric-a"}, {Name: "fabric-b"}}},
		PodMPTCP:          mptcpv1alpha1.PodMPTCP{Transparent: mptcpv1alpha1.TransparentInject}}}
	if err := cb.c.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cb.c.Delete(ctx, policy); err != nil {
			t.Error(err)
		}
	}()
	const conns = 2
	n := cb.bed.Node(1)
	// A program the library does not reach: a server that asks for a
	// TCP listener itself. Its gate names the listener.
	tcpServer := createChanged(t, cb, mptcpv1alpha1.TransparentInject, func(attempt int) *corev1.Pod {
		return nodes.TrafficPod(ns, fmt.Sprintf("tcp-server-%d", attempt), framework.NodeName(n), cb.images[nodes.TrafficImage].Ref,
			map[string]string{"app": "tcp-server"}, []corev1.EnvVar{nodes.PodIPEnv}, "serve", "-listen", fmt.Sprintf("$(POD_IP):%d", tenantPort))
	})
	served := len(nodes.JSONLines[testbed.ServerReport](cb.nodes.WorkloadLog(server, "stdout")))
	w := cb.bed.Watch(t, framework.DatapathEvidence(cb.bed))
	defer w.Close()
	goClient := createChanged(t, cb, mptcpv1alpha1.TransparentInject, func(attempt int) *corev1.Pod {
		return nodes.TrafficPod(ns, fmt.Sprintf("go-client-%d", attempt), framework.NodeName(n), cb.images[nodes.TrafficImage].Ref,
			map[string]string{"app": "go-client"}, nil, "send", "-to", fmt.Sprintf("%s:%d", server.Status.PodIP, tenantPort), "-go-default",
			"-json", "-conns", fmt.Sprint(conns), "-duration", "2s", "-seed", "21")
	})
	if err := cb.nodes.WaitEnded(ctx, cb.c, goClient); err != nil {
		t.Fatal(err)
	}
	installed := false
	for _, s := range goClient.Status.InitContainerStatuses {
		if s.Name != transparent.InitContainerName {
			continue
		}
		log, _ := cb.nodes.NodeOf(goClient).ContainerLog(goClient, s.Name, "stdout")
		installed = s.State.Terminated != nil && s.State.Terminated.ExitCode == 0 && strings.TrimSpace(log) == transparent.LibraryPath
		if !installed {
			t.Errorf("init container %s: state %+v, log %q; want it to have installed %s", s.Name, s.State, log, transparent.LibraryPath)
		}
	}
	if !installed && !t.Failed() {
		t.Errorf("pod %s ran no init container %s: %+v", goClient.Name, transparent.InitContainerName, goClient.Status.InitContainerStatuses)
	}
	sent, err := cb.nodes.SenderReports(goClient)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range sent {
		if !r.MPTCP || r.Error != "" {
			t.Errorf("the unmodified Go client's connection %d: MPTCP %v, error %q; want MPTCP", r.Conn, r.MPTCP, r.Error)
		}
	}
	got, err := cb.nodes.ServerReports(ctx, server, served+len(sent), 30*time.Second)
	if err != nil {
		w.Fail(err)
	}
	w.Match(sent, got)
	t.Logf("transparent inject: pod %s changed by the webhook (%s), %d connections, MPTCP %v, streams whole", goClient.Name,
		goClient.Annotations[transparent.AnnotationMode], len(sent), sent[0].MPTCP)
	cConns := requireTransparentLibcClientGetsMPTCP(t, cb, w, ns, server)
	requireToldToRestart(t, cb, early)
	requireGateNamesTCPListener(t, cb, tcpServer, tenantPort)
	analysis := analyzeWatched(t, w)
	requireSpread(t, analysis, len(sent)+cConns, "the unmodified Go and C clients under transparent inject")

	// off: the same policy now keeps Go's default MPTCP listener from a
	// server that never chooses (which is MPTCP otherwise:
	// hack/traffic's TestGoDefaultsAreMPTCPListenersAndTCPDialers); a
	// client that asks for MPTCP falls back to TCP, whole.
	before := policy.DeepCopy()
	policy.Spec.PodMPTCP.Transparent = mptcpv1alpha1.TransparentOff
	if err := cb.c.Patch(ctx, policy, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	peer := cb.bed.Node(2)
	goServer := createChanged(t, cb, mptcpv1alpha1.TransparentOff, func(attempt int) *corev1.Pod {
		return nodes.TrafficPod(ns, fmt.Sprintf("go-server-%d", attempt), framework.NodeName(peer), cb.images[nodes.TrafficImage].Ref,
			map[string]string{"app": "go-server"}, []corev1.EnvVar{nodes.PodIPEnv},
			"serve", "-listen", fmt.Sprintf("$(POD_IP):%d", tenantPort), "-go-default", "-warmup", "0s", "-window", "1s")
	})
	if goServer.Spec.InitContainers[0].Name == transparent.InitContainerName {
		t.Errorf("off added the preload init container to %s", goServer.Name)
	}
	if err := nodes.WaitStarted(ctx, cb.c, goServer, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := cb.nodes.WaitListening(ctx, goServer, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	mptcpClient := nodes.TrafficPod(tenantNS, "asks-mptcp", framework.NodeName(n), cb.images[nodes.TrafficImage].Ref,
		map[string]string{"app": "client"}, nil, "send", "-to", fmt.Sprintf("%s:%d", goServer.Status.PodIP, tenantPort), "-mptcp",
		"-json", "-conns", "1", "-duration", "1s", "-seed", "22")
	if err := cb.c.Create(ctx, mptcpClient); err != nil {
		t.Fatal(err)
	}
	// Its namespace did not opt in, and no transparent policy selects it.
	if mode, ok := mptcpClient.Annotations[transparent.AnnotationMode]; ok || len(mptcpClient.Spec.InitContainers) != 1 {
		t.Errorf("pod %s/%s of a namespace that did not opt in was changed: mode %q, init containers %d", tenantNS, mptcpClient.Name, mode, len(mptcpClient.Spec.InitContainers))
	}
	if err := cb.nodes.WaitEnded(ctx, cb.c, mptcpClient); err != nil {
		t.Fatal(err)
	}
	sent, err = cb.nodes.SenderReports(mptcpClient)
	if err != nil {
		t.Fatal(err)
	}
	got, err = cb.nodes.ServerReports(ctx, goServer, len(sent), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testbed.MatchReports(sent, got); err != nil {
		t.Errorf("to the server under off: %v", err)
	}
	if sent[0].MPTCP || got[0].MPTCP {
		t.Errorf("under transparent off the Go server's connection is MPTCP (client %v, server %v), want TCP", sent[0].MPTCP, got[0].MPTCP)
	}
	t.Logf("transparent off: pod %s changed by the webhook (%s), a client asking for MPTCP got TCP, whole", goServer.Name,
		goServer.Annotations[transparent.AnnotationMode])

	requireKernelModeSaysWhatTheKernelDoes(t, cb, policy, goServer)

	// Gone before the uninstall's footprint is taken, its sandbox with it.
	deleteAndWait(t, cb, goServer)
}

// requireKernelModeSaysWhatTheKernelDoes: policy, changed to transparent
// kernel, has its pod's node load the socket program. Where this kernel
// refuses it (lockdown, as on the machines the suite runs on: the test
// asks the kernel itself first), the node state's TransparentKernel
// condition is Unsupported with the reason, with a warning event, and the
// policy is Degraded for it; elsewhere the condition is Attached.
func requireKernelModeSaysWhatTheKernelDoes(t *testing.T, cb *chartBed, policy *mptcpv1alpha1.MPTCPPolicy, pod *corev1.Pod) {
	t.Helper()
	ctx := background(t)
	wantReason, why := "Attached", ""
	var refused *socketmptcp.UnsupportedError
	if prog, err := socketmptcp.Load(); errors.As(err, &refused) && !refused.Permanent {
		wantReason, why = "LoadFailed", err.Error()
	} else if err != nil {
		wantReason, why = mptcpv1alpha1.ReasonUnsupported, err.Error()
	} else if err := prog.Close(); err != nil {
		t.Fatal(err)
	}
	before := policy.DeepCopy()
	policy.Spec.PodMPTCP.Transparent = mptcpv1alpha1.TransparentKernel
	if err := cb.c.Patch(ctx, policy, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	var cond, degraded *metav1.Condition
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		var st mptcpv1alpha1.MPTCPNodeState
		if err := cb.c.Get(ctx, client.ObjectKey{Name: pod.Spec.NodeName}, &st); err != nil {
			t.Fatal(err)
		}
		var pol mptcpv1alpha1.MPTCPPolicy
		if err := cb.c.Get(ctx, client.ObjectKeyFromObject(policy), &pol); err != nil {
			t.Fatal(err)
		}
		cond = meta.FindStatusCondition(st.Status.Conditions, mptcpv1alpha1.ConditionTransparentKernel)
		degraded = meta.FindStatusCondition(pol.Status.Conditions, mptcpv1alpha1.ConditionDegraded)
		policyDone := wantReason != mptcpv1alpha1.ReasonUnsupported || (degraded != nil && degraded.Reason == wantReason)
		if cond != nil && cond.Reason == wantReason && policyDone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("transparent kernel on node %s: condition %+v, policy Degraded %+v; want %s (%s)", pod.Spec.NodeName, cond, degraded, wantReason, why)
		}
	}
	if why != "" && !strings.Contains(cond.Message, why) {
		t.Errorf("the node's TransparentKernel condition %q does not give the kernel's reason %q", cond.Message, why)
	}
	if wantReason == mptcpv1alpha1.ReasonUnsupported {
		var list eventsv1.EventList
		if err := cb.c.List(ctx, &list); err != nil {
			t.Fatal(err)
		}
		warned := false
		for _, e := range list.Items {
			warned = warned || (e.Regarding.Kind == "MPTCPNodeState" && e.Regarding.Name == pod.Spec.NodeName && e.Reason == wantReason)
		}
		if !warned {
			t.Errorf("no %s event on node state %s", wantReason, pod.Spec.NodeName)
		}
	}
	t.Logf("transparent kernel: node %s says %s: %s; policy Degraded %s: %s", pod.Spec.NodeName, cond.Reason, cond.Message, degraded.Reason, degraded.Message)
	if wantReason == "Attached" {
		return
	}
	// The tenant, who cannot read node states, reads it on its pod.
	var gate string
	for deadline := time.Now().Add(45 * time.Second); !strings.Contains(gate, "kernel is not in force for this pod"); time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the gate of pod %s, whose node refuses the socket program, says %q", pod.Name, gate)
		}
		var now corev1.Pod
		if err := cb.c.Get(ctx, client.ObjectKeyFromObject(pod), &now); err != nil {
			t.Fatal(err)
		}
		for _, c := range now.Status.Conditions {
			if c.Type == nodes.ReadyCondition {
				gate = c.Message
			}
		}
	}
	t.Logf("transparent kernel: pod %s's gate: %s", pod.Name, gate)
}

// deleteAndWait deletes pod at once and waits until it is gone.
func deleteAndWait(t *testing.T, cb *chartBed, pod *corev1.Pod) {
	t.Helper()
	ctx := background(t)
	if err := cb.c.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		err := cb.c.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s still there a minute after its deletion (%v)", pod.Name, err)
		}
	}
}

// requireTransparentLibcClientGetsMPTCP: a C program linked against glibc
// that never asks for MPTCP (hack/libc-client), in a pod the webhook
// changed for inject, gets MPTCP from the preload library, and its
// connections to the other node's server arrive whole. It returns how
// many connections it opened, for the captures of w.
func requireTransparentLibcClientGetsMPTCP(t *testing.T, cb *chartBed, w *testbed.Watch, ns string, server *corev1.Pod) int {
	t.Helper()
	ctx := background(t)
	const conns, size = 2, 8 << 20
	served := len(nodes.JSONLines[testbed.ServerReport](cb.nodes.WorkloadLog(server, "stdout")))
	cClient := createChanged(t, cb, mptcpv1alpha1.TransparentInject, func(attempt int) *corev1.Pod {
		pod := nodes.TrafficPod(ns, fmt.Sprintf("libc-client-%d", attempt), framework.NodeName(cb.bed.Node(1)), cb.images[nodes.TrafficImage].Ref,
			map[string]string{"app": "libc-client"}, nil, "-c", fmt.Sprint(conns), "-n", fmt.Sprint(size), server.Status.PodIP, fmt.Sprint(tenantPort))
		pod.Spec.Containers[0].Image = cb.images[nodes.LibcClientImage].Ref
		return pod
	})
	if err := cb.nodes.WaitEnded(ctx, cb.c, cClient); err != nil {
		w.Fail(err)
	}
	sent, err := testbed.LibcClientReports([]byte(cb.nodes.WorkloadLog(cClient, "stdout")))
	if err != nil {
		w.Fail(err)
	}
	if len(sent) != conns {
		w.Fail(fmt.Errorf("the C client reported %d connections, want %d; stderr %q", len(sent), conns, cb.nodes.WorkloadLog(cClient, "stderr")))
	}
	got, err := cb.nodes.ServerReports(ctx, server, served+conns, 30*time.Second)
	if err != nil {
		w.Fail(err)
	}
	byRemote := w.Match(sent, got)
	for _, r := range sent {
		if !byRemote[r.Local].MPTCP {
			t.Errorf("the C client's connection from %s reached the server as TCP, want MPTCP", r.Local)
		}
	}
	t.Logf("transparent inject: C client pod %s changed by the webhook, %d connections of %d bytes, MPTCP, streams whole", cClient.Name, conns, size)
	return conns
}

// requireGateNamesTCPListener: the gate of pod, which transparent inject
// changed but whose program asks for a TCP listener itself, names the
// listener as not reached (the agent reads it at its next reconcile).
func requireGateNamesTCPListener(t *testing.T, cb *chartBed, pod *corev1.Pod, port int) {
	t.Helper()
	ctx := background(t)
	var msg, listener string
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if err := cb.c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			t.Fatal(err)
		}
		listener = fmt.Sprintf("%s:%d", pod.Status.PodIP, port)
		for _, c := range pod.Status.Conditions {
			if c.Type == nodes.ReadyCondition {
				msg = c.Message
			}
		}
		if strings.Contains(msg, "listening with TCP only on "+listener) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gate of pod %s, whose server listens with TCP on %s, says %q", pod.Name, listener, msg)
		}
	}
	t.Logf("transparent inject: pod %s's gate: %s", pod.Name, msg)
	deleteAndWait(t, cb, pod)
}

// requireToldToRestart: a pod that a transparent policy selects and the
// webhook never saw (created before the policy) keeps the spec it had,
// and gets a TransparentNotApplied event that says to create it again.
// It is deleted afterwards, its sandbox with it.
func requireToldToRestart(t *testing.T, cb *chartBed, pod *corev1.Pod) {
	t.Helper()
	ctx := background(t)
	var told *eventsv1.Event
	for deadline := time.Now().Add(30 * time.Second); told == nil; time.Sleep(250 * time.Millisecond) {
		var list eventsv1.EventList
		if err := cb.c.List(ctx, &list, client.InNamespace(pod.Namespace)); err != nil {
			t.Fatal(err)
		}
		for i, e := range list.Items {
			if e.Regarding.UID == pod.UID && e.Reason == compile.ReasonTransparentNotApplied {
				told = &list.Items[i]
			}
		}
		if told == nil && time.Now().After(deadline) {
			t.Fatalf("pod %s, created before its transparent policy, got no %s event in 30 s", pod.Name, compile.ReasonTransparentNotApplied)
		}
	}
	if !strings.Contains(told.Note, "create the pod again") {
		t.Errorf("the %s event does not say what to do: %q", told.Reason, told.Note)
	}
	var now corev1.Pod
	if err := cb.c.Get(ctx, client.ObjectKeyFromObject(pod), &now); err != nil {
		t.Fatal(err)
	}
	if _, changed := now.Annotations[transparent.AnnotationMode]; changed || len(now.Spec.InitContainers) != 0 {
		t.Errorf("pod %s, created before the policy, was changed: annotations %v, init containers %d", pod.Name, now.Annotations, len(now.Spec.InitContainers))
	}
	t.Logf("transparent inject: pod %s created before the policy kept its spec and was told: %s", pod.Name, told.Note)
	deleteAndWait(t, cb, pod)
}

// createChanged creates the pod newPod(attempt) returns until the webhook
// has changed it for mode. The webhook reads policies from the
// controller's cache, which may not hold a new or changed policy yet: a
// pod created before is admitted as it was, and deleted for another.
func createChanged(t *testing.T, cb *chartBed, mode mptcpv1alpha1.TransparentMPTCP, newPod func(attempt int) *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx := background(t)
	for attempt := 1; ; attempt++ {
		pod := newPod(attempt)
		if err := cb.c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		if pod.Annotations[transparent.AnnotationMode] == string(mode) {
			return pod
		}
		if attempt == 20 {
			t.Fatalf("the webhook did not change pod %s for %s (annotations %v)", pod.Name, mode, pod.Annotations)
		}
		if err := cb.c.Delete(ctx, pod); err != nil {
			t.Fatal(err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// requireNodeStatesOfExamples checks what the controller compiled from the
// examples for each node the kubelets registered: the examples' paths name
// the bed's NICs, the node's pod CIDR is the one its Node has, and the
// node's server pod is there with its address.
func requireNodeStatesOfExamples(t *testing.T, cb *chartBed, servers map[int]*corev1.Pod) {
	t.Helper()
	for _, n := range cb.bed.Nodes {
		var st mptcpv1alpha1.MPTCPNodeState
		if err := cb.c.Get(context.Background(), client.ObjectKey{Name: framework.NodeName(n)}, &st); err != nil {
			t.Fatal(err)
		}
		var ifaces []string
		for _, p := range st.Spec.Paths {
			ifaces = append(ifaces, p.Name+"="+p.Interface.Name)
		}
		if want := []string{"fabric-a=nic1", "fabric-b=nic2"}; !slices.Equal(ifaces, want) {
			t.Errorf("paths of node %d: %v, want %v", n.Index, ifaces, want)
		}
		if want := []string{n.PodCIDR.String()}; !slices.Equal(st.Spec.PodCIDRs, want) {
			t.Errorf("pod CIDRs of node %d: %v, want %v", n.Index, st.Spec.PodCIDRs, want)
		}
		server := servers[n.Index]
		found := false
		for _, p := range st.Spec.Pods {
			found = found || (p.Name == server.Name && slices.Equal(p.IPs, []string{server.Status.PodIP}))
		}
		if !found {
			t.Errorf("node %d's state does not hold its server pod %s at %s: %+v", n.Index, server.Name, server.Status.PodIP, st.Spec.Pods)
		}
	}
}

// tenantServers makes the tenant namespace (labelled as the examples'
// policy selects it, its pods allowed to await the agent's gate) and a
// server pod on every node, by node index.
func (cb *chartBed) tenantServers(t *testing.T) map[int]*corev1.Pod {
	t.Helper()
	ctx := background(t)
	cb.namespace(t, tenantNS, tenantLabels)
	if err := nodes.AllowAwait(ctx, cb.c, tenantNS); err != nil {
		t.Fatal(err)
	}
	servers := map[int]*corev1.Pod{}
	for _, n := range cb.bed.Nodes {
		servers[n.Index] = cb.serverPod(n)
		if err := cb.c.Create(ctx, servers[n.Index]); err != nil {
			t.Fatal(err)
		}
	}
	return servers
}

// applyExamples applies examples/paths.yaml and policy-spread.yaml and waits
// until every server's workload listens (past the agent's gate).
func (cb *chartBed) applyExamples(t *testing.T, servers map[int]*corev1.Pod) {
	t.Helper()
	ctx := background(t)
	examples := filepath.Join(testenv.RepoRoot(), "examples")
	if err := cb.cp.ApplyFiles(ctx, filepath.Join(examples, "paths.yaml"), filepath.Join(examples, "policy-spread.yaml")); err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		if err := nodes.WaitStarted(ctx, cb.c, s, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := cb.nodes.WaitListening(ctx, s, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// crossTransfer has a client pod on every node send MPTCP to the other
// node's server for capturedTransfer, captured, and fails the test unless
// every stream arrives whole; it returns what the captures show and how
// many connections were sent.
func (cb *chartBed) crossTransfer(t *testing.T, servers map[int]*corev1.Pod) (*testbed.Analysis, int) {
	t.Helper()
	ctx := background(t)
	w := cb.bed.Watch(t, framework.DatapathEvidence(cb.bed))
	const conns = 2
	var clients []*corev1.Pod
	for _, n := range cb.bed.Nodes {
		peer := servers[3-n.Index]
		cl := nodes.TrafficPod(tenantNS, fmt.Sprintf("client%d", n.Index), framework.NodeName(n), cb.images[nodes.TrafficImage].Ref,
			map[string]string{"app": "client"}, []corev1.EnvVar{{Name: "SERVER", Value: fmt.Sprintf("%s:%d", peer.Status.PodIP, tenantPort)}},
			"send", "-to", "$(SERVER)", "-mptcp", "-json", "-conns", fmt.Sprint(conns), "-duration", capturedTransfer.String(), "-seed", fmt.Sprint(n.Index),
			// Each connection's join before the bulk of its data: the
			// examples' policy opens it once the connection has carried
			// 128 KiB (joinAfterBytes), so the client sends twice that
			// first. A loaded node's path manager, which spaces its
			// readings of a pod by ten times what the last one took, may
			// take a second or more to see it: the join is not missed
			// for a 2-s transfer over, and the captures still fail one
			// that never comes.
			"-await-joins", "1", "-await-after", fmt.Sprint(256<<10), "-await-timeout", "5s")
		if err := cb.c.Create(ctx, cl); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, cl)
	}
	var sent []testbed.SenderReport
	var got []testbed.ServerReport
	for _, cl := range clients {
		if err := cb.nodes.WaitEnded(ctx, cb.c, cl); err != nil {
			w.Fail(err)
		}
		reps, err := cb.nodes.SenderReports(cl)
		if err != nil {
			w.Fail(err)
		}
		sent = append(sent, reps...)
	}
	for _, s := range servers {
		reps, err := cb.nodes.ServerReports(ctx, s, conns, 30*time.Second)
		if err != nil {
			w.Fail(err)
		}
		got = append(got, reps...)
	}
	w.Match(sent, got)
	return analyzeWatched(t, w), len(sent)
}
