package benchdoc

import (
	"strings"
	"testing"
)

// AssertFits fails t if a section body, wrapped as ReplaceSection writes
// it, still has a line over MaxLineChars: each generator's test renders
// its report on the widest figures a run gives and asks this.
func AssertFits(t testing.TB, body string) {
	t.Helper()
	wrapped := Wrap(body)
	if long := LongLines(wrapped); len(long) > 0 {
		t.Errorf("lines over %d characters:\n%s\n\nthe section:\n%s", MaxLineChars, strings.Join(long, "\n"), wrapped)
	}
}
