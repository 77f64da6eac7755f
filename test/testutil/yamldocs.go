package testutil

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// YAMLDocuments splits a multi-document YAML stream into its documents
// ("---" lines between them, as apimachinery's YAMLReader reads them),
// leaving out those that hold only blank lines and comments.
func YAMLDocuments(t testing.TB, data []byte) [][]byte {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("reading YAML documents: %v", err)
		}
		if !onlyComments(doc) {
			docs = append(docs, doc)
		}
	}
}

// onlyComments reports whether doc holds nothing but blank lines and
// comments.
func onlyComments(doc []byte) bool {
	for line := range bytes.Lines(doc) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return false
		}
	}
	return true
}
