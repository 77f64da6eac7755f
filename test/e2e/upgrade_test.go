package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/agentapi"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testutil/bpfutil"
)

// previousRelease is the last release before map migration existed: its
// struct subflow had a pad where the rule index is now, so its pinned
// subflow table has a different layout from this binary's.
const previousRelease = "091c18c"

// releaseFormat writes node's configuration in the file format of
// previousRelease: one file with the settings, the paths numbered from 0
// (its datapath's numbering: the API's index minus one) with their NICs'
// next hops, one rule over the paths, and the pods by namespace and veth.
func releaseFormat(node *testbed.Node) framework.AgentOption {
	type path struct {
		Name      string     `json:"name"`
		Index     uint32     `json:"index"`
		Interface string     `json:"interface"`
		Gateway   netip.Addr `json:"gateway"`
	}
	type rule struct {
		Name  string   `json:"name"`
		Paths []string `json:"paths"`
	}
	type pod struct {
		Name          string       `json:"name"`
		NetNS         string       `json:"netns"`
		HostInterface string       `json:"hostInterface"`
		IPs           []netip.Addr `json:"ips"`
		Rule          string       `json:"rule"`
	}
	type config struct {
		Node     string         `json:"node"`
		PinDir   string         `json:"pinDir"`
		StateDir string         `json:"stateDir"`
		PodCIDRs []netip.Prefix `json:"podCIDRs"`
		Paths    []path         `json:"paths"`
		Rules    []rule         `json:"rules"`
		Pods     []pod          `json:"pods"`
	}
	return framework.WithReleaseFormat(func(cfg *framework.NodeConfig) ([]byte, error) {
		c := config{Node: cfg.Node, PinDir: cfg.PinDir, StateDir: cfg.StateDir, PodCIDRs: []netip.Prefix{node.PodCIDR}}
		r := rule{Name: framework.RuleName}
		for _, nic := range node.NICs {
			c.Paths = append(c.Paths, path{Name: framework.PathName(nic.Index), Index: uint32(nic.Index - 1), Interface: nic.Name, Gateway: nic.Gateway})
			r.Paths = append(r.Paths, framework.PathName(nic.Index))
		}
		c.Rules = []rule{r}
		for _, p := range cfg.State.Spec.Pods {
			for _, bp := range node.Pods {
				if bp.Name == p.Name {
					c.Pods = append(c.Pods, pod{Name: bp.Name, NetNS: "/var/run/netns/" + bp.NetNS, HostInterface: bp.HostIf, IPs: []netip.Addr{bp.Addr}, Rule: r.Name})
				}
			}
		}
		return yaml.Marshal(c)
	})
}

// localAPI sends GET path to the agent's local API socket, as root.
func localAPI(t *testing.T, a *framework.Agent, path string, out any) {
	t.Helper()
	sock := filepath.Join(a.Config.StateDir, observe.LocalAPISocket)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	resp, err := c.Get("http://agent" + path)
	if err != nil {
		t.Fatalf("node %d local API %s: %v", a.Node.Index, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("node %d local API %s: %d %s", a.Node.Index, path, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("node %d local API %s: %v: %s", a.Node.Index, path, err, b)
	}
}

// An upgrade under traffic from the previous release's agent to this one:
// the old agents run the bed and place two MPTCP connections over two
// NICs; mid-transfer each is stopped (SIGTERM) and this binary starts on
// the same configuration and pins. Node 1's configuration gains a second
// pod while its agent is down. Asserted: the subflow table was migrated
// (new map behind the pin, layout marker written, the agent says so; the
// test fails if the layouts were equal), no reset in the captures, every
// stream's hash intact, both NICs kept sending through the switch, every
// subflow kept its path and role on both nodes, the pod added while the
// agent was down is steered, and the new agent's local API lists the live
// subflows with their path names.
func testUpgradeFromPreviousReleaseMigratesMapsUnderTraffic(t *testing.T) {
	testbed.RequireTools(t, testbed.CaptureTools...)
	oldBin := previousAgent(t)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 2, LinkRate: "100mbit"})
	ctx := background(t)
	full := framework.AgentConfig(bed, bed.Node(1), mptcpv1alpha1.CompiledRule{})
	first := full.Copy()
	first.State.Spec.Pods = first.State.Spec.Pods[:1]
	a1, err := framework.StartAgent(ctx, bed, oldBin, bed.Node(1), first, declaredCaps, releaseFormat(bed.Node(1)))
	if err != nil {
		t.Fatal(err)
	}
	second := framework.AgentConfig(bed, bed.Node(2), mptcpv1alpha1.CompiledRule{})
	a2, err := framework.StartAgent(ctx, bed, oldBin, bed.Node(2), second, declaredCaps, releaseFormat(bed.Node(2)))
	if err != nil {
		t.Fatal(err)
	}
	agents := []*framework.Agent{a1, a2}
	upgraded := map[*framework.Agent]*framework.NodeConfig{a1: full, a2: second}
	newLayout, err := datapath.LayoutHash()
	if err != nil {
		t.Fatal(err)
	}
	oldMaps := map[*framework.Agent]ebpf.MapID{}
	for _, a := range agents {
		if m, err := datapath.LayoutMarker(a.Config.PinDir); err != nil || m != "" {
			t.Fatalf("node %d: the %s agent left a layout marker %q (%v): it predates markers", a.Node.Index, previousRelease, m, err)
		}
		oldMaps[a] = bpfutil.PinnedMapID(t, filepath.Join(a.Config.PinDir, "subflows"))
	}

	caps, err := bed.StartCaptures("tcp")
	if err != nil {
		t.Fatal(err)
	}
	const conns = 2
	// previousRelease's agent does not hold its joins (see the rollback
	// test below): the senders wait for theirs.
	bed.AwaitJoins(bed.Pod(1, 1), 1)
	old := startFlows(t, bed, []flow{{client: bed.Pod(1, 1), server: bed.Pod(2, 1), port: 5201, conns: conns}}, 8*time.Second)
	client := bed.Pod(1, 1).Addr
	waitPlaced(t, bed, a1, bed.Pod(1, 1), 2*conns)
	before := map[*framework.Agent][]datapath.Subflow{}
	for _, a := range agents {
		if before[a], err = a.Subflows(); err != nil {
			t.Fatal(err)
		}
	}

	// The upgrade: one node after the other, SIGTERM then the new binary.
	_, tx0 := nicBytes(t, bed, bed.Node(1))
	start := time.Now()
	for _, a := range agents {
		if err := a.Stop(); err != nil {
			t.Fatal(err)
		}
		// This tree's binary and file format; node 1 gains a pod while
		// its agent is down.
		a.UseBinary(bins.Agent)
		if err := a.WriteConfig(upgraded[a]); err != nil {
			t.Fatal(err)
		}
		if err := a.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_, tx1 := nicBytes(t, bed, bed.Node(1))
	switchTime := time.Since(start)
	for k := range tx0 {
		sent := tx1[k] - tx0[k]
		t.Logf("nic%d of node 1 sent %d bytes during the %v upgrade", k+1, sent, switchTime)
		// Each NIC carries one subflow per connection at up to 100 Mbit/s
		// (12.5 MB/s); a fifth of that proves it never stalled for long.
		if want := uint64(switchTime.Seconds() * 12.5e6 / 5); sent < want {
			t.Errorf("nic%d of node 1 sent %d bytes during the %v upgrade, want at least %d", k+1, sent, switchTime, want)
		}
	}

	// A migration happened: the layouts differ, so the test proves the
	// conversion, not a reuse.
	for _, a := range agents {
		if m, err := datapath.LayoutMarker(a.Config.PinDir); err != nil || m != newLayout {
			t.Errorf("node %d: layout marker %q (%v) after the upgrade, want this binary's %q", a.Node.Index, m, err, newLayout)
		}
		if id := bpfutil.PinnedMapID(t, filepath.Join(a.Config.PinDir, "subflows")); id == oldMaps[a] {
			t.Errorf("node %d: the subflow table was not migrated (same map %d behind the pin): did the layouts of %s and this binary become equal? Then this test proves nothing and must get a release with a different layout", a.Node.Index, id, previousRelease)
		}
		logs := a.Proc.ErrOutput()
		if !strings.Contains(logs, "map migration committed") || !strings.Contains(logs, `"map":"subflows"`) {
			t.Errorf("node %d: the new agent did not log the subflow table's migration:\n%s", a.Node.Index, logs)
		}
	}

	for _, a := range agents {
		after, err := a.Subflows()
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range before[a] {
			i := slices.IndexFunc(after, func(s datapath.Subflow) bool { return s.Local == b.Local && s.Remote == b.Remote })
			if i < 0 {
				t.Errorf("node %d: subflow %v->%v is gone after the upgrade", a.Node.Index, b.Local, b.Remote)
			} else if after[i].Path != b.Path || after[i].Role != b.Role || after[i].Token != b.Token || after[i].CreatedNs != b.CreatedNs {
				t.Errorf("node %d: subflow %v->%v changed: %+v before, %+v after", a.Node.Index, b.Local, b.Remote, b, after[i])
			}
		}
	}

	// The local API of the new agent lists the live subflows by path name.
	var api []agentapi.SubflowInfo
	localAPI(t, a1, "/v1/subflows", &api)
	names := map[uint32]string{}
	for _, p := range full.State.Spec.Paths {
		names[uint32(p.Index)] = p.Name
	}
	for _, b := range before[a1] {
		i := slices.IndexFunc(api, func(s agentapi.SubflowInfo) bool {
			return s.Local == b.Local.String() && s.Remote == b.Remote.String()
		})
		if i < 0 {
			t.Errorf("local API of node 1 does not list subflow %v->%v: %+v", b.Local, b.Remote, api)
			continue
		}
		s := api[i]
		wantRole := map[datapath.Role]string{datapath.RoleInitiator: "initiator", datapath.RoleResponder: "responder"}[b.Role]
		if s.Path != names[b.Path] || s.Role != wantRole || s.Created.IsZero() || time.Since(s.Created) > time.Minute {
			t.Errorf("local API of node 1: subflow %v->%v is %+v, want path %q, role %s, created in the last minute", b.Local, b.Remote, s, names[b.Path], wantRole)
		}
	}
	// Another user cannot reach it (the socket is root's, 0600).
	sock := filepath.Join(a1.Config.StateDir, observe.LocalAPISocket)
	nobody := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
		"curl", "-sS", "--max-time", "5", "--unix-socket", sock, "http://agent/v1/subflows")
	if out, err := nobody.CombinedOutput(); err == nil || strings.Contains(string(out), "10.") {
		t.Errorf("user nobody read node 1's local API (%v): %s", err, out)
	}
	var apiConns []agentapi.ConnectionInfo
	localAPI(t, a1, "/v1/connections", &apiConns)
	if n := len(slices.DeleteFunc(apiConns, func(c agentapi.ConnectionInfo) bool { return c.Local != client.String() || len(c.Paths) != 2 })); n != conns {
		t.Errorf("local API of node 1 lists %d connections of pod 1 over both paths, want %d: %+v", n, conns, apiConns)
	}

	// The pod added while the agent was down is steered by the new one.
	fresh := runFlows(t, bed, []flow{{client: bed.Pod(1, 2), server: bed.Pod(2, 2), port: 5202, conns: 1}}, 2*time.Second)
	total := old() + fresh
	analysis, err := caps.Analyze()
	if err != nil {
		t.Fatal(err)
	}
	requireSpread(t, analysis, total, "across the upgrade")
	resets, err := framework.UnexpectedResets(t, caps.Files)
	if err != nil {
		t.Fatal(err)
	}
	if len(resets) != 0 {
		t.Errorf("%d resets in the captures:\n%s", len(resets), strings.Join(resets, "\n"))
	}
}

// linkPrograms maps every link pinned under pinDir to the id of the
// program it runs.
func linkPrograms(t *testing.T, pinDir string) map[string]ebpf.ProgramID {
	t.Helper()
	out := map[string]ebpf.ProgramID{}
	pins, err := filepath.Glob(filepath.Join(pinDir, "links", "*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pin := range pins {
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := l.Info()
		_ = l.Close()
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(pinDir, pin)
		out[rel] = info.Program
	}
	return out
}

// An upgrade whose first reconcile fails rolls back under traffic: the new
// agent exits with the reason, every pinned link runs the previous
// release's program again, links it added are gone, the old subflow table
// is still the pinned one and no marker was written; the transfer goes on
// without a reset and every subflow keeps its path. The next start, with a
// configuration that reconciles, migrates and commits.
func testUpgradeWhoseFirstReconcileFailsRollsBack(t *testing.T) {
	testbed.RequireTools(t, testbed.CaptureTools...)
	oldBin := previousAgent(t)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	ctx := background(t)
	good := framework.AgentConfig(bed, bed.Node(1), mptcpv1alpha1.CompiledRule{})
	a1, err := framework.StartAgent(ctx, bed, oldBin, bed.Node(1), good, declaredCaps, releaseFormat(bed.Node(1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := framework.StartAgent(ctx, bed, oldBin, bed.Node(2), framework.AgentConfig(bed, bed.Node(2), mptcpv1alpha1.CompiledRule{}),
		declaredCaps, releaseFormat(bed.Node(2))); err != nil {
		t.Fatal(err)
	}
	caps, err := bed.StartCaptures("tcp")
	if err != nil {
		t.Fatal(err)
	}
	const conns = 2
	// previousRelease's agent opens joins without holding them, which
	// exposes its transfer to the receiving kernel placing data at the
	// wrong offset: the senders wait for their join instead.
	bed.AwaitJoins(bed.Pod(1, 1), 1)
	wait := startFlows(t, bed, []flow{{client: bed.Pod(1, 1), server: bed.Pod(2, 1), port: 5201, conns: conns}}, 6*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	var before []datapath.Subflow
	for len(before) < 2*conns {
		if before, err = a1.Subflows(); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 1 placed %d subflows, want %d", len(before), 2*conns)
		}
		time.Sleep(100 * time.Millisecond)
	}
	oldLinks := linkPrograms(t, a1.Config.PinDir)
	oldMap := bpfutil.PinnedMapID(t, filepath.Join(a1.Config.PinDir, "subflows"))

	// A path index the datapath has no room for: the first reconcile
	// fails for the node (a pod's problem would skip that pod only).
	bad := good.Copy()
	bad.State.Spec.Paths[1].Index = 40
	if err := a1.Stop(); err != nil {
		t.Fatal(err)
	}
	a1.UseBinary(bins.Agent)
	if err := a1.WriteConfig(bad); err != nil {
		t.Fatal(err)
	}
	if err := a1.Start(ctx); err == nil {
		t.Fatal("the new agent reported a successful first reconcile with a path index beyond the datapath's")
	}
	select {
	case <-a1.Proc.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the new agent did not exit after its migration was rolled back")
	}
	if logs := a1.Proc.ErrOutput(); !strings.Contains(logs, "migration rolled back") {
		t.Errorf("the new agent did not say it rolled the migration back:\n%s", logs)
	}
	if got := linkPrograms(t, a1.Config.PinDir); !maps.Equal(got, oldLinks) {
		t.Errorf("pinned links and their programs after the rollback %v, want the previous release's %v", got, oldLinks)
	}
	if id := bpfutil.PinnedMapID(t, filepath.Join(a1.Config.PinDir, "subflows")); id != oldMap {
		t.Errorf("subflows pin is map %d after the rollback, want the previous release's %d", id, oldMap)
	}
	if m, err := datapath.LayoutMarker(a1.Config.PinDir); err != nil || m != "" {
		t.Errorf("layout marker %q (%v) after the rollback, want none", m, err)
	}
	after, err := a1.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range before {
		i := slices.IndexFunc(after, func(s datapath.Subflow) bool { return s.Local == b.Local && s.Remote == b.Remote })
		if i < 0 || after[i].Path != b.Path || after[i].Role != b.Role {
			t.Errorf("subflow %v->%v (path %d) is not where it was after the rollback", b.Local, b.Remote, b.Path)
		}
	}

	// Fixed configuration: the same binary migrates and commits.
	if err := a1.WriteConfig(good); err != nil {
		t.Fatal(err)
	}
	if err := a1.Start(ctx); err != nil {
		t.Fatal(err)
	}
	want, _ := datapath.LayoutHash()
	if m, _ := datapath.LayoutMarker(a1.Config.PinDir); m != want {
		t.Errorf("layout marker %q after the good start, want %q", m, want)
	}
	total := wait()
	analysis, err := caps.Analyze()
	if err != nil {
		t.Fatal(err)
	}
	requireSpread(t, analysis, total, "across the rolled back upgrade")
	resets, err := framework.UnexpectedResets(t, caps.Files)
	if err != nil {
		t.Fatal(err)
	}
	if len(resets) != 0 {
		t.Errorf("%d resets in the captures:\n%s", len(resets), strings.Join(resets, "\n"))
	}
}

var (
	previousAgentOnce sync.Once
	previousAgentBin  string
	previousAgentErr  error
)

// previousAgent builds previousRelease's agent once for the package (into
// the directory TestMain removes) and returns its path.
func previousAgent(t *testing.T) string {
	t.Helper()
	previousAgentOnce.Do(func() {
		start := time.Now()
		previousAgentBin, previousAgentErr = framework.BuildRelease(filepath.Dir(bins.Agent), previousRelease)
		t.Logf("the agent of %s built in %s", previousRelease, time.Since(start).Round(100*time.Millisecond))
	})
	if errors.Is(previousAgentErr, framework.ErrNoHistory) {
		testbed.Unavailable(t, "%v", previousAgentErr)
	}
	if previousAgentErr != nil {
		t.Fatal(previousAgentErr)
	}
	return previousAgentBin
}
