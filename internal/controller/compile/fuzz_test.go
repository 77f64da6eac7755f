package compile

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzParsePreferredPaths: the annotation is written by tenants, so whatever
// it holds, parsing must not panic, and what it accepts must be a short list
// of distinct path names that parses back to itself.
func FuzzParsePreferredPaths(f *testing.F) {
	for _, s := range []string{"fabric-a", "fabric-b, fabric-a", "", ",", "ns/pod=fabric-a", "a,a", "A", strings.Repeat("x,", 20)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		names, problem := ParsePreferredPaths(value)
		if problem != "" {
			if names != nil {
				t.Fatalf("refused %q but returned %v", value, names)
			}
			return
		}
		if len(names) == 0 || len(names) > MaxPreferredPaths {
			t.Fatalf("accepted %q as %d names", value, len(names))
		}
		seen := map[string]bool{}
		for _, n := range names {
			if len(validation.IsDNS1123Label(n)) > 0 || seen[n] {
				t.Fatalf("accepted %q with name %q", value, n)
			}
			seen[n] = true
		}
		again, problem := ParsePreferredPaths(strings.Join(names, ","))
		if problem != "" || !slices.Equal(again, names) {
			t.Fatalf("%v does not parse back: %v %s", names, again, problem)
		}
	})
}
