package charts

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// versionLine is Chart.yaml's version.
var versionLine = regexp.MustCompile(`(?m)^version: *(\S+) *$`)

// chartContent is the chart's version and a digest of every file of the
// chart, Chart.yaml's version line left out.
func chartContent(t *testing.T) (version, digest string) {
	t.Helper()
	dir := chartDir()
	var paths []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			paths = append(paths, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	digest = digestFiles(t, dir, paths, func(rel string, b []byte) []byte {
		if rel != "Chart.yaml" {
			return b
		}
		m := versionLine.FindSubmatch(b)
		if m == nil {
			t.Fatal("Chart.yaml has no version line")
		}
		version = string(m[1])
		return versionLine.ReplaceAll(b, nil)
	})
	return version, digest
}

// digestFiles is a digest of the files at paths, each named by its path
// relative to root and its content as edit leaves it, in the order of
// their paths.
func digestFiles(t *testing.T, root string, paths []string, edit func(rel string, b []byte) []byte) string {
	t.Helper()
	paths = slices.Sorted(slices.Values(paths))
	h := sha256.New()
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, path)
		b = edit(rel, b)
		fmt.Fprintf(h, "%s\x00%d\x00", filepath.ToSlash(rel), len(b))
		h.Write(b)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// digestRecord is where the chart's content is recorded with its version.
func digestRecord() string { return filepath.Join(filepath.Dir(chartDir()), "mptcp-operator.digest") }

// The chart's version moves with every change to the chart: an admin who
// upgrades sees a new version for any new content, and `helm upgrade` of an
// unchanged version changes nothing. charts/mptcp-operator.digest records
// the content of the version in Chart.yaml; content that differs under the
// same version fails here. After bumping the version, `make chart-digest`
// records the new content (and refuses to record new content under the
// version already recorded).
func chartVersionMovesWithTheChart(t *testing.T) {
	version, digest := chartContent(t)
	b, err := os.ReadFile(digestRecord())
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	recVersion, recDigest, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	if os.Getenv("CHART_DIGEST_RECORD") != "" {
		if recVersion == version && recDigest != digest {
			t.Fatalf("the chart changed since version %s was recorded: bump version in charts/mptcp-operator/Chart.yaml first", version)
		}
		if err := os.WriteFile(digestRecord(), []byte(version+" "+digest+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("recorded %s %s", version, digest)
		return
	}
	switch {
	case recVersion != version:
		t.Fatalf("Chart.yaml says version %s, %s records %q: run make chart-digest", version, filepath.Base(digestRecord()), recVersion)
	case recDigest != digest:
		t.Fatalf("the chart changed since version %s was recorded: bump version in charts/mptcp-operator/Chart.yaml, then run make chart-digest", version)
	}
}

// appVersionLine is Chart.yaml's appVersion, the images' tag.
var appVersionLine = regexp.MustCompile(`(?m)^appVersion: *"?([^"\s]+)"? *$`)

// binariesContent is a digest of what the chart's images are built from:
// every Go and embedded file of this module's packages that the controller
// and the agent are linked from, and go.mod and go.sum.
func binariesContent(t *testing.T) string {
	t.Helper()
	root := filepath.Dir(filepath.Dir(chartDir()))
	const module = "github.com/mptcp-operator/mptcp-operator"
	cmd := exec.Command("go", "list", "-deps", "-f",
		`{{if .Module}}{{if eq .Module.Path "`+module+`"}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{"\n"}}{{end}}{{end}}`,
		"./cmd/agent", "./cmd/controller")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	paths := []string{filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum")}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		for _, name := range f[1:] {
			paths = append(paths, filepath.Join(f[0], name))
		}
	}
	if len(paths) < 50 {
		t.Fatalf("the binaries are built from %d files: the listing is broken", len(paths))
	}
	return digestFiles(t, root, paths, func(_ string, b []byte) []byte { return b })
}

// The images' tag (the chart's appVersion) moves with every change to the
// binaries, as the chart's version moves with the chart: a node whose
// kubelet pulls IfNotPresent would otherwise keep running an older binary
// under the same tag. charts/mptcp-operator.appversion-digest records what
// the binaries of the appVersion in Chart.yaml are built from; a change
// under the same appVersion fails here. After bumping appVersion (and the
// chart's version, since Chart.yaml changed), `make chart-digest` records
// both.
func appVersionMovesWithTheBinaries(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir(), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := appVersionLine.FindSubmatch(b)
	if m == nil {
		t.Fatal("Chart.yaml has no appVersion line")
	}
	version, digest := string(m[1]), binariesContent(t)
	record := filepath.Join(filepath.Dir(chartDir()), "mptcp-operator.appversion-digest")
	rec, err := os.ReadFile(record)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	recVersion, recDigest, _ := strings.Cut(strings.TrimSpace(string(rec)), " ")
	if os.Getenv("CHART_DIGEST_RECORD") != "" {
		if recVersion == version && recDigest != digest {
			t.Fatalf("the binaries changed since appVersion %s was recorded: bump appVersion in charts/mptcp-operator/Chart.yaml first", version)
		}
		if err := os.WriteFile(record, []byte(version+" "+digest+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("recorded appVersion %s %s", version, digest)
		return
	}
	switch {
	case recVersion != version:
		t.Fatalf("Chart.yaml says appVersion %s, %s records %q: run make chart-digest", version, filepath.Base(record), recVersion)
	case recDigest != digest:
		t.Fatalf("the agent's or the controller's sources changed since appVersion %s was recorded: bump appVersion (and version) in charts/mptcp-operator/Chart.yaml, then run make chart-digest", version)
	}
}
