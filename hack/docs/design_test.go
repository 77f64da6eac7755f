package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// packagePath is a path into the repository's Go packages as design.md
// names them: internal/..., cmd/..., test/..., api/..., bench/..., hack/...,
// preload/..., after a space, a backtick, a parenthesis or a line's start.
var packagePath = regexp.MustCompile("(?m)(?:^|[\\s`(\\[])((?:internal|cmd|test|api|bench|hack|preload)/[A-Za-z0-9_./-]*[A-Za-z0-9_])")

// Every package path docs/design.md names exists: the design describes
// the code as it is, and a package moved or removed shows up here.
func TestDesignNamesPackagesThatExist(t *testing.T) {
	root := testenv.RepoRoot()
	b, err := os.ReadFile(filepath.Join(root, "docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	names := packagePath.FindAllStringSubmatch(string(b), -1)
	if len(names) < 10 {
		t.Fatalf("design.md names %d package paths: the design should say where each part lives", len(names))
	}
	for _, m := range names {
		p := strings.TrimSuffix(m[1], ".")
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("docs/design.md names %s, which does not exist", p)
		}
	}
}
