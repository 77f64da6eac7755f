package testutil

import (
	"strconv"
	"strings"
)

// SNMPCounter finds one of a kernel's SNMP counters by the name nstat gives
// it (a section and a field: MPTcpExtMPJoinSynRx, TcpAttemptFails) in the
// text of /proc/net/netstat or /proc/net/snmp, pairs of lines
// "Section: Field1 Field2" then "Section: value1 value2".
func SNMPCounter(text, name string) (float64, bool) {
	lines := strings.Split(text, "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || len(names) != len(values) {
			continue
		}
		section := strings.TrimSuffix(names[0], ":")
		for j, f := range names[1:] {
			if section+f == name {
				v, err := strconv.ParseFloat(values[j+1], 64)
				return v, err == nil
			}
		}
	}
	return 0, false
}
