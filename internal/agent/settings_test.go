package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// File mode reads the node state the API holds, as kubectl prints it
// (status included, and ignored): the same object kube mode reads, with no
// format of its own. A misspelt field, another kind or a nameless object is
// an error that says so.
func TestFileModeReadsTheAPIsNodeState(t *testing.T) {
	dir := t.TempDir()
	capacity := resource.MustParse("10G")
	state := nodeState(twoPaths(), podWith("web", "10.244.1.10", spread(7)))
	state.TypeMeta = metav1.TypeMeta{APIVersion: mptcpv1alpha1.GroupVersion.String(), Kind: "MPTCPNodeState"}
	state.Spec.Paths[1].Capacity = capacity
	state.Status.Errors = []string{"an earlier problem"}
	printed, err := yaml.Marshal(state)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := LoadNodeState(write("n1.yaml", string(printed)))
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "n1" || !reflect.DeepEqual(got.Spec.Rules, state.Spec.Rules) || !reflect.DeepEqual(got.Spec.Pods, state.Spec.Pods) ||
		got.Spec.Paths[1].Capacity.Cmp(capacity) != 0 {
		t.Errorf("read back %+v, want the spec written %+v", got.Spec, state.Spec)
	}
	for name, c := range map[string]struct{ content, want string }{
		"misspelt": {strings.Replace(string(printed), "maxSubflows", "maxSubflow", 1), `unknown field "maxSubflow"`},
		"kind":     {strings.Replace(string(printed), "kind: MPTCPNodeState", "kind: MPTCPPolicy", 1), `kind "MPTCPPolicy", want MPTCPNodeState`},
		"nameless": {"spec: {}\n", "metadata.name: must be the node's name"},
	} {
		if _, err := LoadNodeState(write(name+".yaml", c.content)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
	if _, err := LoadSettings(write("settings.yaml", "node: n1\ntableBse: 4000\n")); err == nil || !strings.Contains(err.Error(), "tableBse") {
		t.Errorf("a misspelt setting: %v", err)
	}
	s, err := LoadSettings(write("settings.yaml", "node: n1\ntableBase: 4000\n"))
	if err != nil || s.TableBase != 4000 || s.RulePriority != DefaultRulePriority || s.PinDir != DefaultPinRoot+"/n1" {
		t.Errorf("settings %+v (%v), want tableBase 4000 and the defaults", s, err)
	}
}

// The node state docs/agent.md shows for file mode is one the agent reads
// and translates without a problem.
func TestTheDocumentedNodeStateIsEnforceable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/agent.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```yaml\napiVersion: mptcp.io/v1alpha1\n")
	example, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/agent.md shows no node state")
	}
	p := filepath.Join(t.TempDir(), "node1.yaml")
	if err := os.WriteFile(p, []byte("apiVersion: mptcp.io/v1alpha1\n"+example), 0o600); err != nil {
		t.Fatal(err)
	}
	state, err := LoadNodeState(p)
	if err != nil {
		t.Fatal(err)
	}
	links := []NodeLink{testLinks[1], {Name: "enp2s0f0", Up: true, Gateway: testLinks[2].Gateway}}
	tr := FromNodeState(NodeDefaults("node1"), state, nil, links, locateAll, Prior{})
	if len(tr.Errors)+len(tr.PathProblems) != 0 || len(tr.Plan.Rules) != 1 || len(tr.Plan.Pods) != 1 || len(tr.Plan.Paths) != 2 {
		t.Errorf("the documented node state: errors %v, problems %v, plan %+v", tr.Errors, tr.PathProblems, tr.Plan)
	}
}

func TestFlapDampingFlag(t *testing.T) {
	for _, c := range []struct {
		in   string
		want FlapDamping
		err  bool
	}{
		{in: "3/1m/10s", want: FlapDamping{Transitions: 3, Window: metav1.Duration{Duration: time.Minute}, Hold: metav1.Duration{Duration: 10 * time.Second}}},
		{in: "off", want: FlapDamping{Transitions: -1}},
		{in: "0/1m/10s", err: true},
		{in: "3/1m", err: true},
		{in: "3/-1s/10s", err: true},
		{in: "3/1m/ten", err: true},
	} {
		got, err := ParseFlapDamping(c.in)
		if (err != nil) != c.err || (err == nil && got != c.want) {
			t.Errorf("ParseFlapDamping(%q) = %+v, %v; want %+v, error %v", c.in, got, err, c.want, c.err)
		}
	}
	if d := (FlapDamping{Transitions: -1}).damping(); d.Transitions != 0 {
		t.Errorf("off: damping %+v, want none", d)
	}
	if s := NodeDefaults("n1"); s.FlapDamping.Transitions != DefaultFlapTransitions || s.FlapDamping.Hold.Duration != DefaultFlapHold {
		t.Errorf("defaults: %+v", s.FlapDamping)
	}
}

func TestJoinHoldoffFlagAndSetting(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{in: "100ms", want: 100 * time.Millisecond},
		{in: "0", want: 0},
		{in: "10s", want: MaxJoinHoldoff},
		{in: "11s", err: true},
		{in: "-1ms", err: true},
		{in: "soon", err: true},
	} {
		got, err := ParseJoinHoldoff(c.in)
		if (err != nil) != c.err || (err == nil && got != c.want) {
			t.Errorf("ParseJoinHoldoff(%q) = %v, %v; want %v, error %v", c.in, got, err, c.want, c.err)
		}
	}
	if d := NodeDefaults("n1").joinHoldoff(); d != DefaultJoinHoldoff {
		t.Errorf("default join holdoff %v, want %v", d, DefaultJoinHoldoff)
	}
	off := Settings{JoinHoldoff: &metav1.Duration{}}
	if d := off.joinHoldoff(); d != 0 {
		t.Errorf("joinHoldoff: 0s holds joins %v, want not at all", d)
	}
	p := filepath.Join(t.TempDir(), "settings.yaml")
	if err := os.WriteFile(p, []byte("node: n1\njoinHoldoff: 1h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSettings(p); err == nil || !strings.Contains(err.Error(), "joinHoldoff") {
		t.Errorf("a settings file holding joins an hour: %v, want an error naming joinHoldoff", err)
	}
}

func TestLivenessFlagAndSetting(t *testing.T) {
	ms := func(n int) metav1.Duration { return metav1.Duration{Duration: time.Duration(n) * time.Millisecond} }
	for _, c := range []struct {
		in   string
		want Liveness
		err  bool
	}{
		{in: "off", want: Liveness{Off: true}},
		{in: "7471/30ms/5", want: Liveness{Port: 7471, Interval: ms(30), DetectMultiplier: 5}},
		{in: "9000/10s/100", want: Liveness{Port: 9000, Interval: ms(10000), DetectMultiplier: 100}},
		{in: "7471/5ms/5", err: true},  // faster than MinLivenessInterval
		{in: "7471/11s/5", err: true},  // slower than MaxLivenessInterval
		{in: "7471/30ms/1", err: true}, // one lost probe would take a path down
		{in: "7471/30ms/101", err: true},
		{in: "70000/30ms/5", err: true},
		{in: "0/30ms/5", err: true},
		{in: "7471/soon/5", err: true},
		{in: "7471/30ms", err: true},
		{in: "7471/30ms/5/10s", want: Liveness{Port: 7471, Interval: ms(30), DetectMultiplier: 5, IdleInterval: ms(10000)}},
		{in: "7471/30ms/5/500ms", err: true}, // faster than MinLivenessIdleInterval
		{in: "7471/30ms/5/61s", err: true},   // slower than MaxLivenessIdleInterval
		{in: "7471/10s/5/2s", err: true},     // idle peers probed more often than busy ones
		{in: "7471/30ms/5/2s/1", err: true},
	} {
		got, err := ParseLiveness(c.in)
		if (err != nil) != c.err || (err == nil && got != c.want) {
			t.Errorf("ParseLiveness(%q) = %+v, %v; want %+v, error %v", c.in, got, err, c.want, c.err)
		}
	}
	s := NodeDefaults("n1")
	if s.Liveness != (Liveness{Port: DefaultLivenessPort, Interval: ms(30), DetectMultiplier: DefaultLivenessMultiplier, IdleInterval: ms(2000)}) {
		t.Errorf("defaults: %+v", s.Liveness)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "settings.yaml")
	if err := os.WriteFile(path, []byte("node: n1\nliveness: {interval: 1ms}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSettings(path); err == nil || !strings.Contains(err.Error(), "liveness.interval") {
		t.Errorf("a settings file with a 1 ms interval: %v, want an error naming liveness.interval", err)
	}
}
