package testutil

import (
	"strings"
	"testing"
)

func TestYAMLDocumentsLeavesOutEmptyAndCommentOnlyDocuments(t *testing.T) {
	in := "# a file comment\n---\na: 1\n---\n\n---\n# only a comment\n---\nb: 2\n# trailing\n"
	docs := YAMLDocuments(t, []byte(in))
	var got []string
	for _, d := range docs {
		got = append(got, strings.TrimSpace(string(d)))
	}
	want := []string{"a: 1", "b: 2\n# trailing"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("documents %q, want %q", got, want)
	}
}
