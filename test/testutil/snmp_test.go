package testutil

import "testing"

// Counters are found by section and field, in either of a pair's lines'
// sections, and nowhere else.
func TestSNMPCounterReadsNstatsNames(t *testing.T) {
	text := "Tcp: RtoAlgorithm AttemptFails RetransSegs\nTcp: 1 7 42\n" +
		"MPTcpExt: MPJoinSynRx DataCsumErr\nMPTcpExt: 3 0\n"
	for name, want := range map[string]float64{"TcpAttemptFails": 7, "TcpRetransSegs": 42, "MPTcpExtMPJoinSynRx": 3, "MPTcpExtDataCsumErr": 0} {
		if got, ok := SNMPCounter(text, name); !ok || got != want {
			t.Errorf("%s: %v, %v; want %v", name, got, ok, want)
		}
	}
	for _, name := range []string{"TcpExtIPReversePathFilter", "Tcp", "AttemptFails"} {
		if v, ok := SNMPCounter(text, name); ok {
			t.Errorf("%s found (%v) in a text without it", name, v)
		}
	}
}
