package xdpdrop

import (
	"path/filepath"
	"testing"
)

// The report at its widest (every case, four-digit nanoseconds, many runs)
// is written whole and fits the docs' lines: ReplaceSection refuses a
// line it cannot wrap.
func TestTheReportFitsTheDocsOnAWideRun(t *testing.T) {
	results := map[string][]float64{}
	for i, c := range cases {
		for range 100 {
			results[c.key] = append(results[c.key], 9999.9-float64(i))
		}
	}
	if err := writeReport(filepath.Join(t.TempDir(), "benchmarks.md"), results, "99.99", 1514); err != nil {
		t.Fatal(err)
	}
}
