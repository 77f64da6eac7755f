package datapath

import (
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// cEnum is the enum name of the datapath object's BTF.
func cEnum(t *testing.T, name string) *btf.Enum {
	t.Helper()
	spec, err := loadDatapath()
	if err != nil {
		t.Fatal(err)
	}
	var e *btf.Enum
	if err := spec.Types.TypeByName(name, &e); err != nil {
		t.Fatalf("enum %s not in the object's BTF (a datapath.c global keeps it there): %v", name, err)
	}
	return e
}

// The limits are defined once in C (enum limit, bpf/include/common.h: the
// programs and their maps are sized by it) and once in Go (package limits:
// the agent, the controller and the API check it). They meet here: every C
// limit has its Go constant, with the same value.
func TestLimitsAreTheCEnum(t *testing.T) {
	goLimits := map[string]uint64{
		"LIMIT_PATHS":           limits.Paths,
		"LIMIT_RULES":           limits.Rules,
		"LIMIT_POD_RULES":       limits.PodRules,
		"LIMIT_RULE_PORTS":      limits.RulePorts,
		"LIMIT_RULE_CIDRS":      limits.RuleCIDRs,
		"LIMIT_SUBFLOWS":        limits.Subflows,
		"LIMIT_WEIGHT":          limits.Weight,
		"LIMIT_PODS":            limits.Pods,
		"LIMIT_POD_SUBFLOWS":    limits.PodSubflows,
		"LIMIT_BURST_MIN_BYTES": limits.MinBurstBytes,
		"LIMIT_BURST_MAX_BYTES": limits.MaxBurstBytes,
	}
	seen := map[string]bool{}
	for _, v := range cEnum(t, "limit").Values {
		seen[v.Name] = true
		want, ok := goLimits[v.Name]
		switch {
		case !ok:
			t.Errorf("%s = %d in C has no Go constant: add it to package limits and to this test", v.Name, v.Value)
		case v.Value != want:
			t.Errorf("%s = %d in C, %d in Go (package limits)", v.Name, v.Value, want)
		}
	}
	for name := range goLimits {
		if !seen[name] {
			t.Errorf("%s is not in C's enum limit (bpf/include/common.h)", name)
		}
	}
}
