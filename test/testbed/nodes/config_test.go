package nodes

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// CNI pods of a node take the addresses its pre-built bed pods leave free.
func TestPodRangeStartsAfterPrebuiltPods(t *testing.T) {
	tests := map[string]struct {
		pods        []string // addresses of the bed's pre-built pods on the node
		first, last string   // what host-local may hand out
	}{
		"no pre-built pods":  {first: "10.244.3.11", last: "10.244.3.254"},
		"two pre-built pods": {pods: []string{"10.244.3.11", "10.244.3.12"}, first: "10.244.3.13", last: "10.244.3.254"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n := &testbed.Node{Index: 3, PodCIDR: netip.MustParsePrefix("10.244.3.0/24")}
			for _, a := range tc.pods {
				n.Pods = append(n.Pods, &testbed.Pod{Addr: netip.MustParseAddr(a)})
			}
			first, last := podRange(n)
			if first.String() != tc.first || last.String() != tc.last {
				t.Fatalf("range %s-%s, want %s-%s", first, last, tc.first, tc.last)
			}
		})
	}
}

// The kubelet writes container logs in the CRI format; a line longer than
// its buffer arrives in partial (P) pieces ended by a full (F) one.
func TestCRILogJoinsPartialLines(t *testing.T) {
	raw := strings.Join([]string{
		`2026-11-23T17:31:16.605670000Z stderr F listening on [::]:5201 mptcp=true`,
		`2026-11-23T17:31:17.000000000Z stdout P {"local":"10.244.2.11:5201",`,
		`2026-11-23T17:31:17.000000001Z stdout F "bytes":8}`,
		`2026-11-23T17:31:18.000000000Z stdout F `,
	}, "\n")
	var out strings.Builder
	criLog(&out, []byte(raw), "stdout")
	if want := "{\"local\":\"10.244.2.11:5201\",\"bytes\":8}\n\n"; out.String() != want {
		t.Fatalf("stdout %q, want %q", out.String(), want)
	}
	out.Reset()
	criLog(&out, []byte(raw), "")
	if !strings.HasPrefix(out.String(), "listening on [::]:5201 mptcp=true\n{") {
		t.Fatalf("both streams: %q", out.String())
	}
}
