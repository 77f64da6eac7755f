// Package release tests `make release` (hack/tools/release): two builds of
// the same tree give the same bytes in every file, and what they hold is what
// docs/install.md#release says: a chart helm reads, an OCI image index per
// image with linux/amd64 and linux/arm64, plugin archives with an executable
// for their platform, a krew manifest naming them by sha256, SBOMs of this
// module and its dependencies, and SHA256SUMS over every file.
package release

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"debug/macho"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

const module = "github.com/mptcp-operator/mptcp-operator"

var (
	images  = []string{"controller", "agent", "traffic", "conformance"}
	arches  = []string{"amd64", "arm64"}
	plugins = []struct{ goos, goarch string }{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}}
)

func TestRelease(t *testing.T) {
	tool := testutil.BuiltTool(t, "RELEASE_TOOL", "test-release")
	imagebuild := testutil.BuiltTool(t, "IMAGEBUILD", "imagebuild")
	helm := testutil.BuiltTool(t, "HELM", "helm")
	cyclonedx := testutil.BuiltTool(t, "CYCLONEDX_GOMOD", "test-release")
	version := chartVersion(t)
	build := func(out string, v string) ([]byte, error) {
		cmd := exec.Command(tool, "-repo", testenv.RepoRoot(), "-out", out, "-version", v,
			"-imagebuild", imagebuild, "-helm", helm, "-cyclonedx", cyclonedx)
		return cmd.CombinedOutput()
	}
	if b, err := build(filepath.Join(t.TempDir(), "r"), "0.0.0-not-the-chart"); err == nil ||
		!strings.Contains(string(b), "is not the chart's version "+version) {
		t.Fatalf("a VERSION other than the chart's: err %v, output:\n%s", err, b)
	}
	dirs := []string{filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")}
	for _, d := range dirs {
		if b, err := build(d, version); err != nil {
			t.Fatalf("release: %v\n%s", err, b)
		}
	}
	a, b := readDir(t, dirs[0]), readDir(t, dirs[1])
	if !slices.Equal(sortedKeys(a), sortedKeys(b)) {
		t.Fatalf("the two builds wrote different files: %v and %v", sortedKeys(a), sortedKeys(b))
	}
	for name, data := range a {
		if !bytes.Equal(data, b[name]) {
			t.Errorf("%s differs between two builds of the same tree", name)
		}
	}
	files := a
	t.Run("SHA256SUMS", func(t *testing.T) { checkSums(t, files) })
	t.Run("chart", func(t *testing.T) { checkChart(t, helm, dirs[0], version) })
	t.Run("images", func(t *testing.T) { checkImages(t, files) })
	t.Run("plugins", func(t *testing.T) { checkPlugins(t, files) })
	t.Run("SBOMs", func(t *testing.T) { checkSBOMs(t, files) })
}

func chartVersion(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "charts/mptcp-operator/Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct{ Version string }
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c.Version
}

func readDir(t *testing.T, dir string) map[string][]byte {
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]byte{}
	for _, e := range entries {
		if e.IsDir() {
			t.Errorf("%s: a directory in the release", e.Name())
			continue
		}
		if m[e.Name()], err = os.ReadFile(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func sortedKeys(m map[string][]byte) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	slices.Sort(k)
	return k
}

func checkSums(t *testing.T, files map[string][]byte) {
	listed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(files["SHA256SUMS"]))
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		got := sha256.Sum256(files[name])
		if _, exists := files[name]; !exists || hex.EncodeToString(got[:]) != sum {
			t.Errorf("SHA256SUMS: %s does not verify", name)
		}
		listed[name] = true
	}
	for name := range files {
		if name != "SHA256SUMS" && !listed[name] {
			t.Errorf("SHA256SUMS does not list %s", name)
		}
	}
}

func checkChart(t *testing.T, helm, dir, version string) {
	tgz := filepath.Join(dir, "mptcp-operator-"+version+".tgz")
	out, err := exec.Command(helm, "show", "chart", tgz).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "version: "+version) {
		t.Fatalf("helm show chart %s: %v\n%s", tgz, err, out)
	}
	out, err = exec.Command(helm, "template", "mptcp", tgz, "--namespace", "mptcp-system").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "kind: DaemonSet") {
		t.Fatalf("helm template %s: %v\n%.2000s", tgz, err, out)
	}
}

// ociDescriptor and ociIndex are the parts of the OCI image spec read here.
type ociDescriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Platform  *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

type ociIndex struct {
	Manifests []ociDescriptor `json:"manifests"`
}

func checkImages(t *testing.T, files map[string][]byte) {
	var record struct {
		Images []struct{ Name, Digest, Platform string }
	}
	if err := json.Unmarshal(files["images.json"], &record); err != nil {
		t.Fatal(err)
	}
	digests := map[string]string{}
	for _, r := range record.Images {
		digests[r.Name] = r.Digest
	}
	for _, name := range images {
		entries := untar(t, name+".tar", files[name+".tar"])
		var layout ociIndex
		if err := json.Unmarshal(entries["index.json"], &layout); err != nil {
			t.Fatalf("%s.tar index.json: %v", name, err)
		}
		if len(layout.Manifests) != 1 || !strings.HasSuffix(layout.Manifests[0].MediaType, "image.index.v1+json") ||
			layout.Manifests[0].Digest != digests[name] {
			t.Fatalf("%s.tar: index.json names %+v, want one image index %s (images.json)", name, layout.Manifests, digests[name])
		}
		var index ociIndex
		if err := json.Unmarshal(blob(t, entries, layout.Manifests[0].Digest), &index); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range index.Manifests {
			var manifest struct{ Config ociDescriptor }
			if err := json.Unmarshal(blob(t, entries, m.Digest), &manifest); err != nil {
				t.Fatal(err)
			}
			var config struct{ OS, Architecture string }
			if err := json.Unmarshal(blob(t, entries, manifest.Config.Digest), &config); err != nil {
				t.Fatal(err)
			}
			if m.Platform == nil || m.Platform.OS != config.OS || m.Platform.Architecture != config.Architecture {
				t.Errorf("%s: index entry %+v, config says %s/%s", name, m.Platform, config.OS, config.Architecture)
			}
			got = append(got, config.OS+"/"+config.Architecture)
		}
		if !slices.Equal(got, []string{"linux/amd64", "linux/arm64"}) {
			t.Errorf("%s: index holds %v, want linux/amd64 and linux/arm64", name, got)
		}
	}
}

// blob returns the blob of digest and checks that it has that digest.
func blob(t *testing.T, entries map[string][]byte, digest string) []byte {
	b, ok := entries["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	if !ok {
		t.Fatalf("no blob %s", digest)
	}
	if sum := sha256.Sum256(b); "sha256:"+hex.EncodeToString(sum[:]) != digest {
		t.Fatalf("blob %s has another digest", digest)
	}
	return b
}

func untar(t *testing.T, name string, data []byte) map[string][]byte {
	m := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return m
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: %s owned by %d:%d (%s:%s), want 0:0 unnamed", name, h.Name, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		if m[h.Name], err = io.ReadAll(tr); err != nil {
			t.Fatal(err)
		}
		m[h.Name+"\x00mode"] = []byte{byte(h.Mode & 0o777 >> 6)}
	}
}

func checkPlugins(t *testing.T, files map[string][]byte) {
	var manifest struct {
		Spec struct {
			Platforms []struct {
				Selector    struct{ MatchLabels map[string]string }
				URI, SHA256 string
			}
		}
	}
	if err := yaml.Unmarshal(files["mptcp.yaml"], &manifest); err != nil {
		t.Fatal(err)
	}
	if len(manifest.Spec.Platforms) != len(plugins) {
		t.Errorf("krew manifest names %d platforms, want %d", len(manifest.Spec.Platforms), len(plugins))
	}
	for i, p := range plugins {
		archive := "kubectl-mptcp_" + p.goos + "_" + p.goarch + ".tar.gz"
		data := files[archive]
		if i < len(manifest.Spec.Platforms) {
			mp := manifest.Spec.Platforms[i]
			sum := sha256.Sum256(data)
			if mp.Selector.MatchLabels["os"] != p.goos || mp.Selector.MatchLabels["arch"] != p.goarch ||
				!strings.HasSuffix(mp.URI, "/"+archive) || mp.SHA256 != hex.EncodeToString(sum[:]) {
				t.Errorf("krew manifest entry %d %+v does not name %s with its sha256", i, mp, archive)
			}
		}
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		tarball, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		entries := untar(t, archive, tarball)
		if _, ok := entries["LICENSE"]; !ok {
			t.Errorf("%s has no LICENSE", archive)
		}
		exe := entries["kubectl-mptcp"]
		if entries["kubectl-mptcp\x00mode"][0]&1 == 0 {
			t.Errorf("%s: kubectl-mptcp is not executable by its owner", archive)
		}
		checkExecutable(t, archive, exe, p.goos, p.goarch)
	}
}

func checkExecutable(t *testing.T, archive string, exe []byte, goos, goarch string) {
	switch goos {
	case "linux":
		f, err := elf.NewFile(bytes.NewReader(exe))
		if err != nil {
			t.Fatalf("%s: kubectl-mptcp is not ELF: %v", archive, err)
		}
		want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[goarch]
		if f.Type != elf.ET_EXEC || f.Machine != want {
			t.Errorf("%s: ELF %v %v, want an executable for %v", archive, f.Type, f.Machine, want)
		}
	case "darwin":
		f, err := macho.NewFile(bytes.NewReader(exe))
		if err != nil {
			t.Fatalf("%s: kubectl-mptcp is not Mach-O: %v", archive, err)
		}
		want := map[string]macho.Cpu{"amd64": macho.CpuAmd64, "arm64": macho.CpuArm64}[goarch]
		if f.Type != macho.TypeExec || f.Cpu != want {
			t.Errorf("%s: Mach-O %v %v, want an executable for %v", archive, f.Type, f.Cpu, want)
		}
	}
}

func checkSBOMs(t *testing.T, files map[string][]byte) {
	var want []string
	for _, img := range images {
		for _, a := range arches {
			want = append(want, img+"_linux_"+a+".cdx.json")
		}
	}
	for _, p := range plugins {
		want = append(want, "kubectl-mptcp_"+p.goos+"_"+p.goarch+".cdx.json")
	}
	for _, name := range want {
		var bom struct {
			BOMFormat    string `json:"bomFormat"`
			SerialNumber string `json:"serialNumber"`
			Metadata     struct {
				Timestamp string `json:"timestamp"`
				Component struct {
					Name string `json:"name"`
				} `json:"component"`
			} `json:"metadata"`
			Components []struct {
				Name string `json:"name"`
			} `json:"components"`
		}
		if err := json.Unmarshal(files[name], &bom); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		var deps []string
		for _, c := range bom.Components {
			deps = append(deps, c.Name)
		}
		if bom.BOMFormat != "CycloneDX" || bom.Metadata.Component.Name != module ||
			len(deps) == 0 {
			t.Errorf("%s: format %q, component %q, %d dependencies: want CycloneDX of %s with its dependencies",
				name, bom.BOMFormat, bom.Metadata.Component.Name, len(deps), module)
		}
		if bom.SerialNumber != "" || bom.Metadata.Timestamp != "" {
			t.Errorf("%s: serial %q, timestamp %q: not reproducible", name, bom.SerialNumber, bom.Metadata.Timestamp)
		}
	}
}
