package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

var (
	// mdLink is a Markdown link's target: ](target), the target without
	// spaces.
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// heading is a Markdown heading line.
	heading = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *#*$`)
	// codeBlock is a fenced block, whose lines are no headings.
	codeBlock = regexp.MustCompile("(?ms)^```.*?^```")
)

// anchor is the fragment GitHub gives a heading: lower case, what is
// neither a letter, a digit, a space, a hyphen nor an underscore dropped,
// spaces made hyphens.
func anchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
			b.WriteRune(r)
		case r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the fragments of a Markdown file's headings, with GitHub's
// -1, -2 for repeated ones.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(codeBlock.ReplaceAllString(text, ""), -1) {
		a := anchor(m[1])
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// Every relative link in the repository's Markdown (README, docs/,
// examples/, the chart) names a file that exists and, with a fragment, a
// heading of that file: the docs link to each other by section, and a
// renamed heading must not leave a reader at the top of a long page.
func TestMarkdownLinksReachTheirFilesAndSections(t *testing.T) {
	root := testenv.RepoRoot()
	cache := map[string]map[string]bool{}
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := cache[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		cache[path] = anchors(string(b))
		return cache[path], nil
	}
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "_output" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		text := codeBlock.ReplaceAllString(string(b), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.Join(filepath.Dir(path), file)
			}
			checked++
			info, err := os.Stat(dest)
			if err != nil {
				t.Errorf("%s: link %s: no such file", rel, target)
				continue
			}
			if frag == "" || info.IsDir() || !strings.HasSuffix(dest, ".md") {
				continue
			}
			a, err := anchorsOf(dest)
			if err != nil {
				t.Fatal(err)
			}
			if !a[frag] {
				t.Errorf("%s: link %s: no heading with that anchor", rel, target)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("checked %d links: the walk missed the docs", checked)
	}
}
