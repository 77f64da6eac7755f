// Package images tests `make images` (hack/tools/imagebuild): the same source
// gives the same archives, hence the same digests, and each image is one
// static, reproducibly built binary (or, for the C test client, a program
// with every shared object it loads) with the user and labels the chart
// and docs/install.md rely on.
package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// record is images.json.
type record struct {
	GoVersion       string `json:"goVersion"`
	Revision        string `json:"revision"`
	SourceDateEpoch int64  `json:"sourceDateEpoch"`
	Images          []struct {
		Name, Ref, Archive, Digest, User, Platform string
		ImageID                                    string `json:"imageID"`
	} `json:"images"`
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
}

type ociIndex struct {
	Manifests []descriptor `json:"manifests"`
}

type ociManifest struct {
	Config descriptor   `json:"config"`
	Layers []descriptor `json:"layers"`
}

type imageConfig struct {
	Architecture string    `json:"architecture"`
	OS           string    `json:"os"`
	Created      time.Time `json:"created"`
	Config       struct {
		Entrypoint []string          `json:"Entrypoint"`
		User       string            `json:"User"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

// wantUsers are the users the chart's security contexts assume: the
// controller runs as non-root, the agent as root (it owns bpffs pins and
// /proc/sys/net as uid 0).
var wantUsers = map[string]string{
	"controller":  "65532:65532",
	"agent":       "0:0",
	"traffic":     "0:0",
	"libc-client": "65532:65532",
	"conformance": "65532:65532",
	"pause":       "65535:65535",
}

// cPrograms are the images whose binary is a C program linked against the
// C library.
var cPrograms = map[string]bool{"libc-client": true}

func TestSameSourceGivesTheSameImages(t *testing.T) {
	builder := testutil.BuiltTool(t, "IMAGEBUILD", "imagebuild")
	// Two builds of the same source: make test has built one for the run
	// already (MPTCP_TEST_IMAGES, in a process of its own); otherwise both
	// are built here.
	first, second := t.TempDir(), os.Getenv("MPTCP_TEST_IMAGES")
	builds := []string{first}
	if second == "" {
		second = t.TempDir()
		builds = append(builds, second)
	}
	for _, out := range builds {
		cmd := exec.Command(builder, "-repo", testenv.RepoRoot(), "-out", out)
		// The commit time stamps the files, not the caller's clock.
		cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, b)
		}
	}
	rec := readRecord(t, first)
	if len(rec.Images) != len(wantUsers) {
		t.Fatalf("images.json lists %d images, want %d", len(rec.Images), len(wantUsers))
	}
	names, err := filepath.Glob(filepath.Join(first, "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range names {
		b := filepath.Join(second, filepath.Base(a))
		if !sameBytes(t, a, b) {
			t.Errorf("%s differs between two builds of the same source", filepath.Base(a))
		}
	}
	for _, img := range rec.Images {
		t.Run(img.Name, func(t *testing.T) {
			checkArchive(t, filepath.Join(first, img.Archive), img.Name, img.Ref, img.Digest, rec)
		})
	}
}

func readRecord(t *testing.T, dir string) record {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "images.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatalf("images.json: %v", err)
	}
	return rec
}

func sameBytes(t *testing.T, a, b string) bool {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}

// checkArchive reads an archive as containerd does (index.json, then the
// manifest and its blobs) and checks what the image holds.
func checkArchive(t *testing.T, path, name, ref, digest string, rec record) {
	files := readTar(t, path)
	var index ociIndex
	decodeJSON(t, files["index.json"], &index)
	if len(index.Manifests) != 1 {
		t.Fatalf("index.json has %d manifests, want 1", len(index.Manifests))
	}
	m := index.Manifests[0]
	if m.Digest != digest {
		t.Errorf("index.json names manifest %s, images.json says %s", m.Digest, digest)
	}
	if got := m.Annotations["io.containerd.image.name"]; got != ref {
		t.Errorf("containerd would import the image as %q, want %q", got, ref)
	}
	manifestBytes := blob(t, files, m.Digest)
	var manifest ociManifest
	decodeJSON(t, manifestBytes, &manifest)
	var cfg imageConfig
	decodeJSON(t, blob(t, files, manifest.Config.Digest), &cfg)

	if cfg.Config.User != wantUsers[name] {
		t.Errorf("runs as %q, want %q", cfg.Config.User, wantUsers[name])
	}
	if got := cfg.Config.Labels["org.opencontainers.image.revision"]; got != rec.Revision || got == "" {
		t.Errorf("revision label %q, want images.json's %q", got, rec.Revision)
	}
	if got := cfg.Config.Labels["org.opencontainers.image.source"]; got != "https://github.com/mptcp-operator/mptcp-operator" {
		t.Errorf("source label %q", got)
	}
	epoch := time.Unix(rec.SourceDateEpoch, 0).UTC()
	if !cfg.Created.Equal(epoch) {
		t.Errorf("created %s, want the source date %s", cfg.Created, epoch)
	}
	if len(manifest.Layers) != 1 {
		t.Fatalf("%d layers, want 1 (the binary on an empty base)", len(manifest.Layers))
	}
	layer := readLayer(t, blob(t, files, manifest.Layers[0].Digest), epoch)
	bin := "usr/local/bin/" + name
	if want := []string{"/" + bin}; fmt.Sprint(cfg.Config.Entrypoint) != fmt.Sprint(want) {
		t.Errorf("entrypoint %v, want %v", cfg.Config.Entrypoint, want)
	}
	exe, ok := layer[bin]
	if !ok {
		t.Fatalf("the layer has no %s", bin)
	}
	if cPrograms[name] {
		checkSharedObjectsPresent(t, exe, layer)
		return
	}
	checkStaticReproducibleBinary(t, exe, rec.GoVersion)
	if name == "agent" || name == "controller" {
		checkVersion(t, exe, tagOf(rec, name), rec.Revision, rec.GoVersion)
	}
}

// checkVersion: the binary's -version says the build it was stamped with,
// the images' tag and revision (internal/buildinfo).
func checkVersion(t *testing.T, exe []byte, tag, revision, goVersion string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "binary")
	if err := os.WriteFile(f, exe, 0o700); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(f, "-version").Output()
	if err != nil {
		t.Fatalf("-version: %v", err)
	}
	if got, want := strings.TrimSpace(string(out)), tag+" "+revision+" "+goVersion; got != want {
		t.Errorf("-version says %q, want %q", got, want)
	}
}

// tagOf is the tag of image name's reference in rec.
func tagOf(rec record, name string) string {
	for _, img := range rec.Images {
		if img.Name == name {
			return img.Ref[strings.LastIndex(img.Ref, ":")+1:]
		}
	}
	return ""
}

// checkSharedObjectsPresent: a dynamically linked program finds in the
// layer its interpreter, at the path it names, and every library it or
// another library needs, in a directory the dynamic loader searches.
func checkSharedObjectsPresent(t *testing.T, exe []byte, layer map[string][]byte) {
	t.Helper()
	byName := map[string][]byte{}
	for name, b := range layer {
		if dir := path.Dir(name); dir == "lib/x86_64-linux-gnu" || dir == "usr/lib/x86_64-linux-gnu" || dir == "lib64" {
			byName[path.Base(name)] = b
		}
	}
	queue, seen := [][]byte{exe}, map[string]bool{}
	for len(queue) > 0 {
		f, err := elf.NewFile(bytes.NewReader(queue[0]))
		if err != nil {
			t.Fatalf("not an ELF file: %v", err)
		}
		queue = queue[1:]
		for _, p := range f.Progs {
			if p.Type != elf.PT_INTERP {
				continue
			}
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				t.Fatal(err)
			}
			interp := strings.TrimPrefix(strings.TrimRight(string(b), "\x00"), "/")
			if _, ok := layer[interp]; !ok {
				t.Errorf("the program's interpreter /%s is not in the layer", interp)
			}
		}
		needed, err := f.ImportedLibraries()
		if err != nil {
			t.Fatal(err)
		}
		for _, lib := range needed {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			b, ok := byName[lib]
			if !ok {
				t.Errorf("%s is needed and not in a library directory of the layer", lib)
				continue
			}
			queue = append(queue, b)
		}
	}
	if !seen["libc.so.6"] {
		t.Errorf("the program does not load the C library: needs %v", seen)
	}
}

// checkStaticReproducibleBinary: no dynamic loader, no shared library, no cgo;
// built with -trimpath, no VCS stamp and no Go build ID, which would differ
// from one build to the next.
func checkStaticReproducibleBinary(t *testing.T, exe []byte, goVersion string) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(exe))
	if err != nil {
		t.Fatalf("not an ELF executable: %v", err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("dynamically linked: has a %s program header", p.Type)
		}
	}
	if s := f.Section(".note.go.buildid"); s != nil {
		t.Errorf("carries a Go build ID")
	}
	info, err := buildinfo.Read(bytes.NewReader(exe))
	if err != nil {
		t.Fatalf("build info: %v", err)
	}
	if info.GoVersion != goVersion {
		t.Errorf("built with %s, images.json says %s", info.GoVersion, goVersion)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
		if strings.HasPrefix(s.Key, "vcs") {
			t.Errorf("VCS stamp %s=%s", s.Key, s.Value)
		}
	}
	for k, want := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true", "GOOS": "linux"} {
		if settings[k] != want {
			t.Errorf("build setting %s=%q, want %q", k, settings[k], want)
		}
	}
}

func readTar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files, _ := readTarStream(t, f)
	return files
}

// readLayer also checks the reproducible form of each entry: owned by 0:0,
// stamped with the source date, in name order.
func readLayer(t *testing.T, compressed []byte, epoch time.Time) map[string][]byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(compressed))
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	files, headers := readTarStream(t, zr)
	for i, h := range headers {
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s is owned by %d:%d (%q:%q), want 0:0", h.Name, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		if !h.ModTime.Equal(epoch) {
			t.Errorf("%s is stamped %s, want the source date %s", h.Name, h.ModTime, epoch)
		}
		if i > 0 && headers[i-1].Name >= h.Name {
			t.Errorf("%s follows %s: entries are not in name order", h.Name, headers[i-1].Name)
		}
	}
	return files
}

func readTarStream(t *testing.T, r io.Reader) (map[string][]byte, []*tar.Header) {
	t.Helper()
	files := map[string][]byte{}
	var headers []*tar.Header
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, headers
		}
		if err != nil {
			t.Fatal(err)
		}
		headers = append(headers, h)
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

// blob returns the blob of digest and checks that its bytes hash to it.
func blob(t *testing.T, files map[string][]byte, digest string) []byte {
	t.Helper()
	hexDigest, ok := strings.CutPrefix(digest, "sha256:")
	if !ok {
		t.Fatalf("digest %q is not sha256", digest)
	}
	b, ok := files["blobs/sha256/"+hexDigest]
	if !ok {
		t.Fatalf("no blob %s in the archive", digest)
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != hexDigest {
		t.Fatalf("blob %s does not hash to its name", digest)
	}
	return b
}

func decodeJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%T: %v", v, err)
	}
}
