package benchdoc

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReplaceSectionKeepsTheOthers(t *testing.T) {
	tests := map[string]struct {
		before string // the file before; "" means missing
		want   string // the file after replacing "## B"
	}{
		"missing file": {
			want: "# Benchmarks\n\n## B\nnew\n",
		},
		"section in the middle": {
			before: "# Benchmarks\n\n## A\na\n\n## B\nold\n\n## C\nc\n",
			want:   "# Benchmarks\n\n## A\na\n\n## B\nnew\n\n## C\nc\n",
		},
		"section at the end": {
			before: "# Benchmarks\n\n## A\na\n\n## B\nold\nmore old\n",
			want:   "# Benchmarks\n\n## A\na\n\n## B\nnew\n",
		},
		"section absent": {
			before: "# Benchmarks\n\n## A\na\n",
			want:   "# Benchmarks\n\n## A\na\n\n## B\nnew\n",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "benchmarks.md")
			if tc.before != "" {
				if err := os.WriteFile(path, []byte(tc.before), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := ReplaceSection(path, "## B", "## B\nnew\n"); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("file is\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}
