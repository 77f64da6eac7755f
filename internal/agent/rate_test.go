package agent

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// A rule's rate section is checked with the rest of the configuration, and
// each mistake is named.
func TestRateConfigValidation(t *testing.T) {
	base := `node: n1
paths: [{name: a, index: 1, interface: eth1}, {name: b, index: 2, interface: eth2}]
pods: [{name: p, hostInterface: veth1, ips: [10.244.1.10], rule: r}]
rules:
- name: r
  paths: [a, b]
`
	cases := map[string]struct {
		rule    string
		wantErr string // "" means valid
	}{
		"police per path":          {rule: "  rate: {mode: police, perPath: [{path: a, rate: 20M}], direction: egress}\n"},
		"shape per pod":            {rule: "  rate: {mode: shape, perPod: 20M}\n"},
		"window with opt-in":       {rule: "  headerRewriting: true\n  rate: {mode: window, perConnection: 20M}\n"},
		"window without opt-in":    {rule: "  rate: {mode: window, perConnection: 20M}\n", wantErr: "headers may be rewritten"},
		"unknown mode":             {rule: "  rate: {mode: drop, perPod: 1M}\n", wantErr: "not one of window, police, shape"},
		"negative rate":            {rule: "  rate: {mode: police, perPod: -1M}\n", wantErr: "positive"},
		"zero path rate":           {rule: "  rate: {mode: police, perPath: [{path: a, rate: 0}]}\n", wantErr: "positive"},
		"unknown path":             {rule: "  rate: {mode: police, perPath: [{path: z, rate: 1M}]}\n", wantErr: `no path named "z"`},
		"no cap":                   {rule: "  rate: {mode: police}\n", wantErr: "no cap set"},
		"direction on shape":       {rule: "  rate: {mode: shape, perPod: 1M, direction: egress}\n", wantErr: "only police"},
		"unknown direction":        {rule: "  rate: {mode: police, perPod: 1M, direction: up}\n", wantErr: "not one of egress"},
		"window per path":          {rule: "  headerRewriting: true\n  rate: {mode: window, perPath: [{path: a, rate: 1M}]}\n", wantErr: "connections only"},
		"shape per connection":     {rule: "  rate: {mode: shape, perConnection: 1M}\n", wantErr: "perConnection needs window or police"},
		"burst below the floor":    {rule: "  rate: {mode: police, perPod: 1M, burstBytes: 100}\n", wantErr: "floor"},
		"path named twice in caps": {rule: "  rate: {mode: police, perPath: [{path: a, rate: 1M}, {path: a, rate: 2M}]}\n", wantErr: "twice"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var c Config
			if err := yaml.UnmarshalStrict([]byte(base+tc.rule), &c); err != nil {
				t.Fatalf("parsing: %v", err)
			}
			c.setDefaults()
			err := c.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate: %v, want valid", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate: %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
