package v1alpha1_test

import (
	"os/exec"
	"strings"
	"testing"
)

// Every client of the API and the controller import these types: they must
// not bring the datapath along (cilium/ebpf, an embedded BPF object, and
// generated code that builds on little-endian machines only). The limits the
// API states come from package limits, which imports nothing.
func TestAPIDoesNotImportTheDatapath(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/cilium/") || strings.Contains(pkg, "/internal/datapath") {
			t.Errorf("the API imports %s", pkg)
		}
	}
}
