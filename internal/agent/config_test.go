package agent

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

func selectorConfig() *Config {
	c := &Config{
		Node: "n1",
		Paths: []Path{
			{Name: "a", Index: 1, Interface: "eth1"},
			{Name: "b", Index: 2, Interface: "eth2"},
		},
		Rules: []Rule{
			{Name: "web", Paths: []string{"a", "b"}, SpreadMode: "weighted", Weights: map[string]uint32{"a": 3},
				Traffic: &Traffic{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Ports: []PortRange{{First: 80}, {First: 8000, Last: 8999}}, Family: "IPv4"}},
			{Name: "rest", Paths: []string{"b", "a"}, SpreadMode: "preferred"},
		},
		Pods: []Pod{{Name: "p", HostInterface: "veth1", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.2")}, Rules: []string{"web", "rest"}}},
	}
	c.setDefaults()
	return c
}

// A rule's traffic, spread mode and weights compile to the datapath's rule.
func TestConfigCompilesSelectorsAndSpread(t *testing.T) {
	c := selectorConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	paths := map[string]Path{"a": c.Paths[0], "b": c.Paths[1]}
	got, err := c.Rules[0].datapathRule(paths)
	if err != nil {
		t.Fatal(err)
	}
	if got.Spread != datapath.SpreadWeighted || len(got.Weights) != 2 || got.Weights[0] != 3 || got.Weights[1] != 1 ||
		got.Family != datapath.FamilyIPv4 || len(got.Ports) != 2 || got.Ports[0] != (datapath.PortRange{First: 80, Last: 80}) ||
		len(got.CIDRs) != 1 {
		t.Fatalf("compiled %+v", got)
	}
	if names := c.Pods[0].ruleNames(); len(names) != 2 || names[0] != "web" {
		t.Fatalf("pod rules %v", names)
	}
}

// Each mistake is reported with where it is.
func TestConfigRejectsBadSelectors(t *testing.T) {
	tests := map[string]struct {
		edit func(c *Config)
		want string
	}{
		"unknown spread mode":      {func(c *Config) { c.Rules[1].SpreadMode = "random" }, `rules[1]: spreadMode: "random"`},
		"weights without weighted": {func(c *Config) { c.Rules[1].Weights = map[string]uint32{"a": 2} }, "rules[1]: weights: only for spreadMode weighted"},
		"weight of another path":   {func(c *Config) { c.Rules[0].Weights = map[string]uint32{"z": 2} }, `weights: "z" is not one of the rule's paths`},
		"zero weight":              {func(c *Config) { c.Rules[0].Weights = map[string]uint32{"a": 0} }, "out of range 1..255"},
		"bad family":               {func(c *Config) { c.Rules[0].Traffic.Family = "ipx" }, `traffic.family: "ipx"`},
		"CIDR of the other family": {func(c *Config) { c.Rules[0].Traffic.CIDRs = []netip.Prefix{netip.MustParsePrefix("fd00::/8")} }, "does not belong to the rule's family"},
		"empty port range":         {func(c *Config) { c.Rules[0].Traffic.Ports = []PortRange{{First: 90, Last: 80}} }, "port range 90-80"},
		"unknown pod rule":         {func(c *Config) { c.Pods[0].Rules = []string{"web", "nope"} }, `pods[0].rules: no rule named "nope"`},
		"rule and rules":           {func(c *Config) { c.Pods[0].Rule = "web" }, "set rule or rules, not both"},
		"no rule":                  {func(c *Config) { c.Pods[0].Rules = nil }, "pods[0].rules: 0 rules"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := selectorConfig()
			tc.edit(c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// The shorthand still works.
	c := selectorConfig()
	c.Pods[0].Rules, c.Pods[0].Rule = nil, "rest"
	if err := c.Validate(); err != nil {
		t.Fatalf("pod with rule shorthand: %v", err)
	}
}

// The YAML form of docs/agent.md loads into the same rule.
func TestConfigFileWithSelectors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.yaml")
	yaml := `
node: n1
paths:
  - {name: a, index: 1, interface: eth1}
  - {name: b, index: 2, interface: eth2}
rules:
  - name: web
    paths: [a, b]
    spreadMode: weighted
    weights: {a: 3}
    traffic:
      cidrs: [10.244.0.0/16]
      ports: [{first: 5201}, {first: 8000, last: 8999}]
      family: IPv4
pods:
  - {name: p, hostInterface: veth1, ips: [10.244.1.2], rules: [web]}
`
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rules[0]
	if r.Traffic == nil || len(r.Traffic.CIDRs) != 1 || r.Traffic.CIDRs[0] != netip.MustParsePrefix("10.244.0.0/16") ||
		len(r.Traffic.Ports) != 2 || r.Traffic.Ports[1] != (PortRange{First: 8000, Last: 8999}) || r.Weights["a"] != 3 {
		t.Fatalf("loaded rule %+v, traffic %+v", r, r.Traffic)
	}
}
