package datapath

import (
	"path/filepath"
	"testing"
)

// The report at its widest (every case, four-digit nanoseconds, many runs)
// is written whole and fits the docs' lines: ReplaceSection refuses a
// line it cannot wrap.
func TestTheReportFitsTheDocsOnAWideRun(t *testing.T) {
	results.Lock()
	saved := results.ns
	results.ns = map[string][]float64{}
	for _, c := range cases {
		for range 100 {
			results.ns[c.name] = append(results.ns[c.name], 9999.9)
		}
	}
	results.Unlock()
	t.Cleanup(func() {
		results.Lock()
		results.ns = saved
		results.Unlock()
	})
	if err := writeReport(filepath.Join(t.TempDir(), "benchmarks.md")); err != nil {
		t.Fatal(err)
	}
}
