package datapath

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// goName is the field name bpf2go gives a C member: tx_packets -> TxPackets.
func goName(c string) string {
	var b strings.Builder
	for _, part := range strings.Split(c, "_") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}

// Every Go struct bpf2go generated has the size and field offsets of its C
// struct in the object's BTF, so the agent reads and writes the maps the way
// the programs do. A struct edited in C without `make generate-bpf`, or a
// hand edit of the generated Go, fails here.
func TestGoStructsMatchCLayout(t *testing.T) {
	spec, err := loadDatapath()
	if err != nil {
		t.Fatal(err)
	}
	goTypes := map[string]any{
		"flow_key": datapathFlowKey{}, "subflow": datapathSubflow{}, "conn_key": datapathConnKey{},
		"conn_alias": datapathConnAlias{}, "conn": datapathConn{}, "endpoint_key": datapathEndpointKey{},
		"endpoint": datapathEndpoint{}, "rule": datapathRule{}, "nic": datapathNic{}, "path_nic": datapathPathNic{},
		"path_stats": datapathPathStats{}, "mptcp_subtype_stats": datapathMptcpSubtypeStats{},
		"settings_value": datapathSettingsValue{}, "cidr_key": datapathCidrKey{},
		"path_state": datapathPathState{}, "pod_stats": datapathPodStats{}, "pod_record": datapathPodRecord{}, "port_range": datapathPortRange{},
		"table_head": datapathTableHead{}, "subflow_entry": datapathSubflowEntry{}, "subflow_bucket": datapathSubflowBucket{},
		"police_entry": datapathPoliceEntry{}, "police_bucket": datapathPoliceBucket{}, "table_op": datapathTableOp{}, "table_seed_value": datapathTableSeedValue{}, "closed_report": datapathClosedReport{}, "liveness_pair": datapathLivenessPair{}, "liveness_peer": datapathLivenessPeer{}, "peer_cidr_key": datapathPeerCidrKey{}, "peer_paths": datapathPeerPaths{}, "tunnel_hop_key": datapathTunnelHopKey{}, "tunnel_hop": datapathTunnelHop{},
		"rate_cfg": datapathRateCfg{}, "rate_gcra": datapathRateGcra{}, "rate_key": datapathRateKey{}, "rate_bucket": datapathRateBucket{},
		"rate_window": datapathRateWindow{}, "rate_subflow": datapathRateSubflow{}, "rate_ns": datapathRateNs{}, "pod_ns_key": datapathPodNsKey{},
	}
	for cName, goVal := range goTypes {
		t.Run(cName, func(t *testing.T) {
			var st *btf.Struct
			if err := spec.Types.TypeByName(cName, &st); err != nil {
				t.Fatalf("struct %s not in the object's BTF: %v", cName, err)
			}
			gt := reflect.TypeOf(goVal)
			if uintptr(st.Size) != gt.Size() {
				t.Errorf("size: C %d, Go %d", st.Size, gt.Size())
			}
			for _, m := range st.Members {
				f, ok := gt.FieldByName(goName(m.Name))
				if !ok {
					t.Errorf("member %s has no Go field %s", m.Name, goName(m.Name))
					continue
				}
				if off := uintptr(m.Offset.Bytes()); f.Offset != off {
					t.Errorf("member %s: C offset %d, Go %d", m.Name, off, f.Offset)
				}
				size, err := btf.Sizeof(m.Type)
				if err != nil {
					t.Fatal(err)
				}
				if uintptr(size) != f.Type.Size() {
					t.Errorf("member %s: C size %d, Go %d", m.Name, size, f.Type.Size())
				}
			}
			// Go fields C does not have (beyond the layout marker).
			if n := gt.NumField() - 1; n != len(st.Members) {
				t.Errorf("Go has %d fields, C %d members", n, len(st.Members))
			}
		})
	}
	// Every struct gen.go asks bpf2go for is checked here.
	src, err := os.ReadFile("gen.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range regexp.MustCompile(`-type (\w+)`).FindAllStringSubmatch(string(src), -1) {
		var st *btf.Struct
		if spec.Types.TypeByName(name[1], &st) != nil {
			continue // an enum
		}
		if _, ok := goTypes[name[1]]; !ok {
			t.Errorf("struct %s is generated but not checked here", name[1])
		}
	}
}

// Go's names for enum values match the C enums: spread modes.
func TestGoAndBPFAgreeOnSpreadModes(t *testing.T) {
	var e *btf.Enum
	spec, err := loadDatapath()
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Types.TypeByName("spread_mode", &e); err != nil {
		t.Fatal(err)
	}
	want := map[string]SpreadMode{"SPREAD_ROUND_ROBIN": SpreadRoundRobin, "SPREAD_WEIGHTED": SpreadWeighted, "SPREAD_PREFERRED": SpreadPreferred}
	if len(e.Values) != len(want) {
		t.Fatalf("C has %d spread modes, Go %d", len(e.Values), len(want))
	}
	for _, v := range e.Values {
		if g, ok := want[v.Name]; !ok || uint64(g) != v.Value {
			t.Errorf("%s = %d in C, Go has %v (%v)", v.Name, v.Value, g, ok)
		}
	}
}
