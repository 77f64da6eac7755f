package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

const (
	// maxDocsBytes is what docs/*.md may weigh together, counted as disk
	// blocks: a reader finishes a reference that says how things are, not
	// one that keeps every finding on the way there. 250 KiB as
	// `du -sk docs` reports it, the directory's own block included.
	maxDocsBytes = 250*1024 - blockBytes
	// blockBytes is a filesystem block: each page counts its size rounded
	// up to it, so the total is what `du -sk docs` reports on a 4 KiB-block
	// filesystem, less the directory's own block.
	blockBytes = 4096
	// maxPageBytes is one page's share.
	maxPageBytes = 40_000
	// maxLineChars is the longest line, code blocks and tables included:
	// a diff, a terminal and a review tool show it whole.
	maxLineChars = 120
)

var (
	// isoDate is a calendar date, YYYY-MM-DD.
	isoDate = regexp.MustCompile(`\b(19|20)\d\d-[01]\d-[0-3]\d\b`)
	// commitHash is a commit's hash, short or long: 7 to 40 hex digits
	// with at least one digit and one letter (a number or a word of
	// a-f alone is none).
	commitHash = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
	hexLetter  = regexp.MustCompile(`[a-f]`)
	hexDigit   = regexp.MustCompile(`[0-9]`)
)

// docsPages are docs/*.md, by name.
func docsPages(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 10 {
		t.Fatalf("found %d pages in docs/: the glob missed them", len(paths))
	}
	pages := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		pages[filepath.Base(p)] = string(b)
	}
	return pages
}

// The docs stay a size a reader finishes: all pages together, each rounded
// up to whole blocks as du counts them, under maxDocsBytes; each page under
// maxPageBytes.
func TestDocsSize(t *testing.T) {
	total, bytes := 0, 0
	for name, text := range docsPages(t) {
		total += (len(text) + blockBytes - 1) / blockBytes * blockBytes
		bytes += len(text)
		if len(text) > maxPageBytes {
			t.Errorf("docs/%s is %d bytes, over %d: cut repetition and history, or split it", name, len(text), maxPageBytes)
		}
	}
	if total > maxDocsBytes {
		t.Errorf("docs/*.md take %d bytes in %d-byte blocks together (%d bytes of text), over %d: "+
			"a page just over a block boundary costs a whole block", total, blockBytes, bytes, maxDocsBytes)
	}
}

// No line of the docs is longer than maxLineChars, code blocks and tables
// included. values.md is left out: valuesdoc writes it from values.yaml's
// comments and schema, and its table rows are as long as those comments.
func TestDocsLineLength(t *testing.T) {
	for name, text := range docsPages(t) {
		if name == "values.md" {
			continue
		}
		for i, line := range strings.Split(text, "\n") {
			if n := len([]rune(line)); n > maxLineChars {
				t.Errorf("docs/%s:%d: %d characters, over %d", name, i+1, n, maxLineChars)
			}
		}
	}
}

// The docs say how things are: when something changed and in which commit
// is git's and CHANGELOG.md's. Only benchmarks.md, which records when and
// on what a run was made, carries dates and commits.
func TestDocsCarryNoDatesOrCommits(t *testing.T) {
	for name, text := range docsPages(t) {
		if name == "benchmarks.md" {
			continue
		}
		for i, line := range strings.Split(text, "\n") {
			if d := isoDate.FindString(line); d != "" {
				t.Errorf("docs/%s:%d: date %s: history belongs to CHANGELOG.md and git", name, i+1, d)
			}
			for _, h := range commitHash.FindAllString(line, -1) {
				if hexLetter.MatchString(h) && hexDigit.MatchString(h) {
					t.Errorf("docs/%s:%d: commit %s: history belongs to CHANGELOG.md and git", name, i+1, h)
				}
			}
		}
	}
}
