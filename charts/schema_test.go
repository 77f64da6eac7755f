package charts

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/agent"
)

// Bad values are refused before anything reaches a cluster, with a message
// that names the key and what is wrong with it.
func badValuesAreRefusedWithAClearMessage(t *testing.T) {
	cases := map[string]struct {
		// set are the --set arguments.
		set []string
		// want are substrings the error must hold: where, and why.
		want []string
	}{
		"a capability the agent does not declare": {
			set:  []string{"agent.capabilities={NET_ADMIN,NET_RAW}"},
			want: []string{"/agent/capabilities/1", "BPF", "NET_ADMIN", "SYS_ADMIN", "PERFMON"},
		},
		"a capability that is not one at all": {
			set:  []string{"agent.capabilities={all-of-them}"},
			want: []string{"/agent/capabilities/0", "must be one of"},
		},
		"the same capability twice": {
			set:  []string{"agent.capabilities={BPF,BPF}"},
			want: []string{"/agent/capabilities", "items at 0 and 1 are equal"},
		},
		"no capability at all": {
			set:  []string{"agent.capabilities=null"},
			want: []string{"/agent", "missing property 'capabilities'"},
		},
		"a pod label whose key the API refuses": {
			set:  []string{"agent.podLabels.bad key=1"},
			want: []string{"'bad key' does not match pattern"},
		},
		"a pull secret without a name": {
			set:  []string{"imagePullSecrets[0].secret=regcred"},
			want: []string{"/imagePullSecrets/0", "missing property 'name'"},
		},
		"an unknown key": {
			set:  []string{"tolerateEverything=true"},
			want: []string{"additional properties 'tolerateEverything' not allowed"},
		},
		"a misspelt nested key": {
			set:  []string{"agent.nodeSelektor.role=edge"},
			want: []string{"at '/agent'", "additional properties 'nodeSelektor' not allowed"},
		},
		"a negative memory request": {
			set:  []string{"controller.resources.requests.memory=-64Mi"},
			want: []string{"/controller/resources/requests/memory", "-64Mi"},
		},
		"a negative CPU limit as a number": {
			set:  []string{"agent.resources.limits.cpu=-1"},
			want: []string{"/agent/resources/limits/cpu", "minimum"},
		},
		"a negative replica count": {
			set:  []string{"controller.replicas=-1"},
			want: []string{"/controller/replicas", "minimum"},
		},
		"no agent may be replaced at a time": {
			set:  []string{"agent.updateStrategy.maxUnavailable=0"},
			want: []string{"/agent/updateStrategy/maxUnavailable"},
		},
		"a tag inside the repository": {
			set:  []string{"agent.image.repository=ghcr.io/mptcp-operator/agent:0.1.0"},
			want: []string{"/agent/image/repository", "ghcr.io/mptcp-operator/agent:0.1.0"},
		},
		"a digest that is not one": {
			set:  []string{"controller.image.digest=sha256:beef"},
			want: []string{"/controller/image/digest", "sha256:beef"},
		},
		"a pull policy Kubernetes does not know": {
			set:  []string{"agent.image.pullPolicy=Sometimes"},
			want: []string{"/agent/image/pullPolicy", "Always", "IfNotPresent", "Never"},
		},
		"an API server address with a scheme": {
			set:  []string{"apiServer.host=https://10.0.0.1"},
			want: []string{"/apiServer/host", "https://10.0.0.1"},
		},
		"a join holdoff longer than the agent allows": {
			set:  []string{"agent.joinHoldoff=1m"},
			want: []string{"/agent/joinHoldoff", "1m"},
		},
		"a join holdoff that is not a duration": {
			set:  []string{"agent.joinHoldoff=-5ms"},
			want: []string{"/agent/joinHoldoff", "-5ms"},
		},
		"a liveness interval faster than the agent allows": {
			set:  []string{"agent.liveness.interval=5ms"},
			want: []string{"/agent/liveness/interval", "5ms"},
		},
		"a liveness multiplier that one lost probe would trip": {
			set:  []string{"agent.liveness.detectMultiplier=1"},
			want: []string{"/agent/liveness/detectMultiplier", "minimum"},
		},
		"an idle interval longer than a minute": {
			set:  []string{"agent.liveness.idleInterval=90s"},
			want: []string{"/agent/liveness/idleInterval", "90s"},
		},
		"an extra argument that is not a flag": {
			set:  []string{"agent.extraArgs[0]=debug"},
			want: []string{"/agent/extraArgs/0", "debug"},
		},
		"an extra variable without a name": {
			set:  []string{"controller.extraEnv[0].value=1"},
			want: []string{"/controller/extraEnv/0", "name"},
		},
		"a port out of range": {
			set:  []string{"agent.metricsPort=70000"},
			want: []string{"/agent/metricsPort", "maximum"},
		},
		"a metrics address that is not one of the three": {
			set:  []string{"agent.metricsAddress=0.0.0.0"},
			want: []string{"/agent/metricsAddress", "all", "hostIP", "loopback"},
		},
		"a certificate Secret that is no object name": {
			set:  []string{"agent.metricsAuth.certSecret=Agent_TLS"},
			want: []string{"/agent/metricsAuth/certSecret", "Agent_TLS"},
		},
		"a relative host path": {
			set:  []string{"agent.hostPaths.bpffs=sys/fs/bpf"},
			want: []string{"/agent/hostPaths/bpffs", "sys/fs/bpf"},
		},
		"a budget no drain could satisfy": {
			set:  []string{"controller.replicas=1"},
			want: []string{"controller.podDisruptionBudget.minAvailable (1) must be below controller.replicas (1)"},
		},
		"the agents' CA in a Secret and a ConfigMap at once": {
			set: []string{"metrics.serviceMonitor.agentTLS.ca.secret.name=ca", "metrics.serviceMonitor.agentTLS.ca.secret.key=ca.crt",
				"metrics.serviceMonitor.agentTLS.ca.configMap.name=ca", "metrics.serviceMonitor.agentTLS.ca.configMap.key=ca.crt"},
			want: []string{"/metrics/serviceMonitor/agentTLS/ca", "maxProperties"},
		},
		"the agents' CA without its key": {
			set:  []string{"metrics.serviceMonitor.agentTLS.ca.secret.name=agent-metrics-ca"},
			want: []string{"/metrics/serviceMonitor/agentTLS/ca/secret", "missing property 'key'"},
		},
		"a ServiceMonitor without the Services it selects": {
			set:  []string{"metrics.serviceMonitor.enabled=true", "metrics.service.enabled=false"},
			want: []string{"metrics.serviceMonitor.enabled needs metrics.service.enabled"},
		},
		"a path without a spec": {
			set:  []string{"paths[0].name=fabric-a"},
			want: []string{"/paths/0", "missing property 'spec'"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var args []string
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			_, stderr, err := helmTemplate(t, args...)
			if err == nil {
				t.Fatalf("helm template --set %s succeeded; it must be refused", strings.Join(tc.set, " --set "))
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("the error does not say %q:\n%s", w, stderr)
				}
			}
		})
	}
}

// The chart's bound on agent.joinHoldoff is the agent's, written twice (a
// JSON schema cannot compare durations): every hold the schema accepts, the
// agent takes, and the schema accepts the agent's maximum and nothing above.
func joinHoldoffSchemaAgreesWithTheAgent(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("mptcp-operator", "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Agent struct {
				Properties struct {
					JoinHoldoff struct {
						Pattern string `json:"pattern"`
					} `json:"joinHoldoff"`
				} `json:"properties"`
			} `json:"agent"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	pattern := regexp.MustCompile(schema.Properties.Agent.Properties.JoinHoldoff.Pattern)
	candidates := durationCandidates()
	candidates = append(candidates, "9999ms", "10s", "1m", "-5ms")
	for _, v := range candidates {
		_, agentErr := agent.ParseJoinHoldoff(v)
		if pattern.MatchString(v) && agentErr != nil {
			t.Errorf("the schema accepts %q, the agent refuses it: %v", v, agentErr)
		}
	}
	if most := fmt.Sprintf("%ds", int(agent.MaxJoinHoldoff.Seconds())); !pattern.MatchString(most) {
		t.Errorf("the schema refuses the agent's maximum %s", most)
	}
}

// The chart's bounds on agent.liveness are the agent's, written twice: every
// interval the schema accepts, the agent takes, the schema accepts the
// agent's shortest and longest, and the multiplier's bounds are the same.
func livenessSchemaAgreesWithTheAgent(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("mptcp-operator", "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Agent struct {
				Properties struct {
					Liveness struct {
						Properties struct {
							Interval struct {
								Pattern string `json:"pattern"`
							} `json:"interval"`
							Multiplier struct {
								Minimum int `json:"minimum"`
								Maximum int `json:"maximum"`
							} `json:"detectMultiplier"`
							IdleInterval struct {
								Pattern string `json:"pattern"`
							} `json:"idleInterval"`
						} `json:"properties"`
					} `json:"liveness"`
				} `json:"properties"`
			} `json:"agent"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	l := schema.Properties.Agent.Properties.Liveness.Properties
	pattern := regexp.MustCompile(l.Interval.Pattern)
	candidates := durationCandidates()
	for _, v := range candidates {
		_, agentErr := agent.ParseLiveness("7471/" + v + "/5")
		if pattern.MatchString(v) && agentErr != nil {
			t.Errorf("the schema accepts interval %q, the agent refuses it: %v", v, agentErr)
		}
	}
	for _, d := range []time.Duration{agent.MinLivenessInterval, agent.MaxLivenessInterval} {
		if v := fmt.Sprintf("%dms", d.Milliseconds()); !pattern.MatchString(v) && !pattern.MatchString(fmt.Sprintf("%ds", int(d.Seconds()))) {
			t.Errorf("the schema refuses the agent's bound %v", d)
		}
	}
	if l.Multiplier.Minimum != agent.MinLivenessMultiplier || l.Multiplier.Maximum != agent.MaxLivenessMultiplier {
		t.Errorf("schema multiplier %d..%d, the agent's %d..%d", l.Multiplier.Minimum, l.Multiplier.Maximum, agent.MinLivenessMultiplier, agent.MaxLivenessMultiplier)
	}
	idle := regexp.MustCompile(l.IdleInterval.Pattern)
	for s := 0; s <= 70; s++ {
		v := fmt.Sprintf("%ds", s)
		if _, agentErr := agent.ParseLiveness("7471/30ms/5/" + v); idle.MatchString(v) != (agentErr == nil) {
			t.Errorf("idle interval %q: the schema accepts it %v, the agent refuses it: %v", v, idle.MatchString(v), agentErr)
		}
	}
	for _, v := range []string{"500ms", "1000ms", "1m"} {
		if idle.MatchString(v) {
			t.Errorf("the schema accepts idle interval %q, which its pattern should say in whole seconds", v)
		}
	}
}

// durationCandidates are durations around the agent's bounds to try a
// schema's pattern with: milliseconds up to 12 s, and whole seconds.
func durationCandidates() []string {
	var out []string
	for ms := 0; ms <= 12000; ms += 7 {
		out = append(out, fmt.Sprintf("%dms", ms))
	}
	for s := 0; s <= 12; s++ {
		out = append(out, fmt.Sprintf("%ds", s))
	}
	return out
}
