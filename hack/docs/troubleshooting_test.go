// Package docs checks that the documentation keeps up with the code.
package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// Every reason the product writes on a condition, an event or a pod's
// gate, and every alert of the chart, has an entry in docs/troubleshooting.md (a heading "### `Reason`"),
// and every entry there is a reason the product writes: the page an admin
// opens with a reason in hand stays whole and true. The reasons are read
// from the source: constants named Reason* or of type PodProblemReason or
// Cause (kubectl mptcp explain's), fields and assignments named Reason
// given a string literal, and the reasons of setGate.
func TestEveryReasonHasATroubleshootingEntry(t *testing.T) {
	root := testenv.RepoRoot()
	code := map[string]string{} // reason -> where it is written
	for _, dir := range []string{"internal", "api"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			for _, r := range reasonsIn(t, path) {
				if _, ok := code[r]; !ok {
					code[r] = rel
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The chart's alerts are named by the same headings.
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	alerts, err := os.ReadFile(filepath.Join(root, "charts", "mptcp-operator", "files", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(alerts, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			code[r.Alert] = "charts/mptcp-operator/files/alerts.yaml"
		}
	}
	if len(code) < 30 {
		t.Fatalf("found %d reasons in the source, fewer than the product writes: the scan is broken", len(code))
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^### `([A-Za-z]+)`").FindAllSubmatch(doc, -1) {
		documented[string(m[1])] = true
	}
	for _, r := range slices.Sorted(func(yield func(string) bool) {
		for r := range code {
			if !yield(r) {
				return
			}
		}
	}) {
		if !documented[r] {
			t.Errorf("reason %s (%s) has no entry in docs/troubleshooting.md", r, code[r])
		}
	}
	for r := range documented {
		if _, ok := code[r]; !ok {
			t.Errorf("docs/troubleshooting.md has an entry for %s, which nothing in the source writes", r)
		}
	}
}

// reasonsIn are the reasons the Go file at path writes.
func reasonsIn(t *testing.T, path string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	literal := func(e ast.Expr) {
		if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if s, err := strconv.Unquote(lit.Value); err == nil && s != "" {
				out = append(out, s)
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			typed := false
			if id, ok := n.Type.(*ast.Ident); ok && (id.Name == "PodProblemReason" || id.Name == "Cause") {
				typed = true
			}
			for i, name := range n.Names {
				if (typed || strings.HasPrefix(name.Name, "Reason")) && i < len(n.Values) {
					literal(n.Values[i])
				}
			}
		case *ast.KeyValueExpr:
			if id, ok := n.Key.(*ast.Ident); ok && id.Name == "Reason" {
				literal(n.Value)
			}
		case *ast.AssignStmt:
			for i, lhs := range n.Lhs {
				if sel, ok := lhs.(*ast.SelectorExpr); ok && sel.Sel.Name == "Reason" && len(n.Rhs) == len(n.Lhs) {
					literal(n.Rhs[i])
				}
			}
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "setGate" && len(n.Args) > 3 {
				literal(n.Args[3])
			}
		}
		return true
	})
	return out
}
