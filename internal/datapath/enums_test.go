package datapath

import (
	"maps"
	"slices"
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
		"LIMIT_PATHS":              limits.Paths,
		"LIMIT_RULES":              limits.Rules,
		"LIMIT_POD_RULES":          limits.PodRules,
		"LIMIT_RULE_PORTS":         limits.RulePorts,
		"LIMIT_RULE_CIDRS":         limits.RuleCIDRs,
		"LIMIT_SUBFLOWS":           limits.Subflows,
		"LIMIT_WEIGHT":             limits.Weight,
		"LIMIT_PODS":               limits.Pods,
		"LIMIT_POD_SUBFLOWS":       limits.PodSubflows,
		"LIMIT_POD_ARRIVALS":       limits.PodArrivals,
		"LIMIT_POD_ANSWERED":       limits.PodAnswered,
		"LIMIT_POD_ANSWERED_JOINS": limits.PodAnsweredJoins,
		"LIMIT_LIVENESS_PAIRS":     limits.LivenessPairs,
		"LIMIT_PEER_CIDRS":         limits.PeerCIDRs,
		"LIMIT_TUNNEL_HOPS":        limits.TunnelHops,
		"LIMIT_PROBED_PEERS":       limits.ProbedPeers,
		"LIMIT_BURST_MIN_BYTES":    limits.MinBurstBytes,
		"LIMIT_BURST_MAX_BYTES":    limits.MaxBurstBytes,
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

// pinnedEnums are the enums whose values are stored in pinned maps (as a key,
// a value or an index), each enumerator with the number it has had since it
// was added. A pinned map outlives the programs that wrote it, and an upgrade
// or a downgrade carries its integers as they are, so a number never moves and
// is never reused: bpf/include/common.h says so above enum stat_id. A new
// enumerator takes the next unused number and gets its row here. No row is
// ever deleted: a retired enumerator stays in C (renamed if need be, and its
// row with it), so that its number is not given to another.
var pinnedEnums = map[string]map[string]uint64{
	"stat_id": {
		"STAT_PACKETS":                0,
		"STAT_NOT_TCP":                1,
		"STAT_MALFORMED":              2,
		"STAT_MPTCP_SYN":              3,
		"STAT_JOIN_SYN":               4,
		"STAT_JOIN_TOKEN_KNOWN":       5,
		"STAT_JOIN_TOKEN_UNKNOWN":     6,
		"STAT_TOKEN_LEARNT":           7,
		"STAT_SUBFLOW_PLACED":         8,
		"STAT_SUBFLOW_MIRRORED":       9,
		"STAT_MARKED":                 10,
		"STAT_NO_PATH":                11,
		"STAT_PATHS_EXHAUSTED":        12,
		"STAT_MPTCP_OPT_INVALID":      13,
		"STAT_OBSERVED":               14,
		"STAT_NO_RULE_MATCH":          15,
		"STAT_PATH_DOWN_SKIPPED":      16,
		"STAT_ALL_PATHS_DOWN":         17,
		"STAT_SUBFLOW_INSERT":         18,
		"STAT_CONN_INSERT":            19,
		"STAT_MAP_UPDATE_FAILED":      20,
		"STAT_SUBFLOW_FORGOTTEN":      21,
		"STAT_CONN_FORGOTTEN":         22,
		"STAT_RATE_DROP_CONN":         23,
		"STAT_RATE_DROP_POD":          24,
		"STAT_RATE_DROP_PATH":         25,
		"STAT_RATE_WND_LOWERED":       26,
		"STAT_RATE_NO_WSCALE":         27,
		"STAT_RATE_SHAPED":            28,
		"STAT_BACKUP_FLAGGED":         29,
		"STAT_BACKUP_PRIO_SENT":       30,
		"STAT_BACKUP_PRIO_NO_ROOM":    31,
		"STAT_ADD_ADDR_BLOCKED":       32,
		"STAT_JOIN_REFUSED":           33,
		"STAT_SUBFLOW_EVICTED":        34,
		"STAT_POLICE_EVICTED":         35,
		"STAT_SUBFLOW_DETOURED":       36,
		"STAT_SUBFLOW_HOMED":          37,
		"STAT_SUBFLOW_FOLLOWED":       38,
		"STAT_SUBFLOW_CLOSED":         39,
		"STAT_ARRIVAL_STAGED":         40,
		"STAT_ARRIVAL_PROMOTED":       41,
		"STAT_ANSWER_DROPPED":         42,
		"STAT_JOIN_ACK_DROPPED":       43,
		"STAT_POD_SUBFLOWS_FULL":      44,
		"STAT_TCP_OPTS_CUT":           45,
		"STAT_MPTCP_OPTS_AMBIGUOUS":   46,
		"STAT_LIVENESS_REFUSED":       47,
		"STAT_UNREADABLE_TCP_DROPPED": 48,
		"STAT_EDGE_STEERED":           49,
		"STAT_FOREIGN_4TUPLE_DROPPED": 50,
		"STAT_TUNNEL_STEERED":         51,
	},
	"subflow_role": {
		"ROLE_INITIATOR": 1,
		"ROLE_RESPONDER": 2,
	},
	"spread_mode": {
		"SPREAD_ROUND_ROBIN": 0,
		"SPREAD_WEIGHTED":    1,
		"SPREAD_PREFERRED":   2,
	},
	"mptcp_subtype": {
		"MPTCP_SUB_CAPABLE":      0x0,
		"MPTCP_SUB_JOIN":         0x1,
		"MPTCP_SUB_DSS":          0x2,
		"MPTCP_SUB_ADD_ADDR":     0x3,
		"MPTCP_SUB_REMOVE_ADDR":  0x4,
		"MPTCP_SUB_PRIO":         0x5,
		"MPTCP_SUB_FAIL":         0x6,
		"MPTCP_SUB_FASTCLOSE":    0x7,
		"MPTCP_SUB_TCPRST":       0x8,
		"MPTCP_SUB_EXPERIMENTAL": 0xf,
	},
	"rate_mode": {
		"RATE_MODE_NONE":   0,
		"RATE_MODE_WINDOW": 1,
		"RATE_MODE_POLICE": 2,
		"RATE_MODE_SHAPE":  3,
	},
	// The flags of the pinned maps' entries, bits that never move either.
	"setting_flag": {"SETTING_OBSERVE_ONLY": 1 << 0},
	"rule_match":   {"MATCH_INITIAL": 1 << 0, "MATCH_JOIN": 1 << 1},
	"rule_flag":    {"RULE_CIDRS": 1 << 0, "RULE_REWRITE_HEADERS": 1 << 1, "RULE_SHARED_RISK": 1 << 2},
	"path_flag":    {"PATH_DOWN": 1 << 0},
	"nic_flag":     {"NIC_TUNNEL": 1 << 0},
	"rate_flag": {
		"RATE_HEADERS_MAY_BE_REWRITTEN": 1 << 0,
		"RATE_POLICE_EGRESS":            1 << 1,
		"RATE_POLICE_INGRESS":           1 << 2,
		"RATE_COARSE_CLOCK":             1 << 3,
		"RATE_BUDGET":                   1 << 4,
		"RATE_NAMESPACE":                1 << 5,
	},
	"rate_key_kind": {
		"RATE_KEY_CONN": 1,
		"RATE_KEY_FLOW": 2,
		"RATE_KEY_POD":  3,
		"RATE_KEY_PATH": 4,
		"RATE_KEY_NS":   5,
	},
}

// pinnedEnumCounts names, per enum, the enumerator that is not an identity
// but one past the highest (the stats map's count).
var pinnedEnumCounts = map[string]string{"stat_id": "STAT_MAX"}

// Every value of an enum stored in pinned maps is the one pinnedEnums holds:
// none moved, none is reused, and none was added without its row.
func TestPinnedEnumValues(t *testing.T) {
	for _, enum := range slices.Sorted(maps.Keys(pinnedEnums)) {
		t.Run(enum, func(t *testing.T) {
			rows := pinnedEnums[enum]
			rowOf := map[uint64]string{}
			for name, n := range rows {
				rowOf[n] = name
			}
			inC := map[string]bool{}
			byValue := map[uint64]string{}
			var count *btf.EnumValue
			var highest uint64
			for _, v := range cEnum(t, enum).Values {
				if v.Name == pinnedEnumCounts[enum] {
					count = &v
					continue
				}
				inC[v.Name] = true
				highest = max(highest, v.Value)
				if other, ok := byValue[v.Value]; ok {
					t.Errorf("%s and %s are both %d: a number stored in pinned maps names one enumerator", other, v.Name, v.Value)
				}
				byValue[v.Value] = v.Name
				want, ok := rows[v.Name]
				switch {
				case ok && v.Value != want:
					t.Errorf("%s is %d in C, but was %d: numbers stored in pinned maps never move (a new meaning takes a new enumerator, appended)",
						v.Name, v.Value, want)
				case !ok && rowOf[v.Value] != "":
					t.Errorf("%s = %d is new, but %d was %s's: numbers stored in pinned maps are never reused; give it the next unused number and append it to pinnedEnums[%q] in this test",
						v.Name, v.Value, v.Value, rowOf[v.Value], enum)
				case !ok:
					t.Errorf("%s = %d is new: append it to pinnedEnums[%q] in this test (its number is fixed from now on)", v.Name, v.Value, enum)
				}
			}
			for _, name := range slices.Sorted(maps.Keys(rows)) {
				if !inC[name] {
					t.Errorf("%s (%d) is gone from C: its number may still be in pinned maps and must never be reused; keep the enumerator, renamed as retired if need be, here too",
						name, rows[name])
				}
			}
			if name, ok := pinnedEnumCounts[enum]; ok {
				switch {
				case count == nil:
					t.Errorf("%s is gone from C", name)
				case count.Value != highest+1:
					t.Errorf("%s is %d, want %d: one past the highest number", name, count.Value, highest+1)
				}
			}
		})
	}
}
