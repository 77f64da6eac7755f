package benchdoc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// A section as the generators write it, one long line a paragraph: every
// prose line comes out within MaxLineChars, no word broken nor code span
// but one longer than a line, the words in their order; a narrow table
// and fenced code are as they were, a wide table loses its cells' spaces.
func TestWrapKeepsProseWithinTheDocsWidth(t *testing.T) {
	long := strings.Repeat("a word and `a code span` of figures, ", 12)
	item := "- " + strings.Repeat("listed ", 30)
	table := "|" + strings.Repeat(" wide column |", 9)
	code := "```\n" + strings.Repeat("x", 130) + "\n```"
	command := "`BENCH_REPORT=$PWD/docs/benchmarks.md go test -run '^$' -bench BenchmarkSomethingLong -benchtime 10x ./bench/x/`"
	body := "## B\n\n" + command + ", on a machine. " + long + "\n\n" + item + "\n\n" + table + "\n" + code + "\n\n| a | b |\n|---|---|\n"
	got := Wrap(body)
	for i, line := range strings.Split(got, "\n") {
		if strings.HasPrefix(line, "|") || strings.HasPrefix(line, "x") || line == "```" {
			continue
		}
		if n := utf8.RuneCountInString(line); n > MaxLineChars {
			t.Errorf("line %d: %d characters: %q", i+1, n, line)
		}
		// Only the command, longer than a line, may be broken.
		inCommand := strings.Contains(line, "BENCH_REPORT") || strings.Contains(line, "./bench/x/`")
		if strings.Count(line, "`")%2 != 0 && !inCommand {
			t.Errorf("line %d breaks a code span: %q", i+1, line)
		}
	}
	words := func(s string) string {
		return strings.Join(strings.Fields(strings.ReplaceAll(s, "|", " | ")), " ")
	}
	if words(got) != words(body) {
		t.Errorf("the words changed:\n%s", got)
	}
	if !strings.Contains(got, "|"+strings.Repeat("wide column|", 9)+"\n") {
		t.Errorf("the wide table did not lose its cells' spaces:\n%s", got)
	}
	for _, kept := range []string{code, "| a | b |\n|---|---|"} {
		if !strings.Contains(got, kept) {
			t.Errorf("%q was changed", kept)
		}
	}
	for _, line := range strings.Split(got, "\n") {
		if strings.HasPrefix(line, "listed") {
			t.Errorf("a list item's continuation is not indented: %q", line)
		}
	}
}

// A table row too wide to break is written, with the rest of the run, and
// named in the error: the figures are kept and the run fails.
func TestReplaceSectionWritesAndRefusesATableTooWide(t *testing.T) {
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	row := "|" + strings.Repeat("a column too wide|", 8)
	err := ReplaceSection(path, "## B", "## B\n\n"+row+"\n")
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("error %v, want one naming line 3", err)
	}
	got, _ := os.ReadFile(path)
	if !strings.Contains(string(got), row) {
		t.Errorf("the section was not written:\n%s", got)
	}
}
