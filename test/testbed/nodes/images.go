package nodes

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// Images are the image archives `make images` (hack/tools/imagebuild)
// writes, by image name (controller, agent, traffic, libc-client, conformance, pause), as its
// images.json lists them.
type Images map[string]Image

// Names of the images real nodes and their tests use.
const (
	PauseImage   = "pause"
	TrafficImage = "traffic"
	// LibcClientImage runs hack/libc-client, a C program linked against
	// glibc (testbed.LibcClientReports reads what it prints).
	LibcClientImage = "libc-client"
	// ConformanceImage runs test/e2e/conformance in a pod: the chart's helm
	// test.
	ConformanceImage = "conformance"
)

// ReadImages reads dir/images.json, which the image builder writes next to
// the archives.
func ReadImages(dir string) (Images, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "images.json"))
	if err != nil {
		return nil, fmt.Errorf("%w: run `make images`", err)
	}
	var rec struct {
		Images []struct {
			Name, Ref, Archive string
		} `json:"images"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, fmt.Errorf("%s/images.json: %w", dir, err)
	}
	im := Images{}
	for _, i := range rec.Images {
		im[i.Name] = Image{Ref: i.Ref, Archive: filepath.Join(dir, i.Archive)}
	}
	if _, ok := im[PauseImage]; !ok {
		return nil, fmt.Errorf("%s/images.json has no %s image", dir, PauseImage)
	}
	return im, nil
}

// BuildImages runs the image builder (builder: `make print-imagebuild`; make
// test sets IMAGEBUILD) on this repository into dir, and reads what it made.
func BuildImages(builder, dir string) (Images, error) {
	out, err := exec.Command(builder, "-repo", testenv.RepoRoot(), "-out", dir).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", builder, err, out)
	}
	return ReadImages(dir)
}

// All lists every image, to import them all.
func (im Images) All() []Image {
	var out []Image
	for _, i := range im {
		out = append(out, i)
	}
	return out
}

// ImagesEnv names a directory of this tree's images built before the tests
// (`make test` builds them once for the whole run, so that no test package
// builds them again). Unset, ForTest builds them itself.
const ImagesEnv = "MPTCP_TEST_IMAGES"

// TestImages are this tree's images for a test process: read from
// $MPTCP_TEST_IMAGES or built once, on first use, with make images'
// builder ($IMAGEBUILD).
type TestImages struct {
	once   sync.Once
	dir    string // built here: Remove removes it
	images Images
	err    error
}

// ForTest returns the images, building them on first use; a machine
// without the builder skips the test (fatal under CI=true).
func (ti *TestImages) ForTest(t testing.TB) Images {
	t.Helper()
	dir := os.Getenv(ImagesEnv)
	builder := ""
	if dir == "" {
		builder = testutil.BuiltTool(t, "IMAGEBUILD", "imagebuild")
	}
	ti.once.Do(func() {
		start := time.Now()
		if dir != "" {
			ti.images, ti.err = ReadImages(dir)
			return
		}
		if ti.dir, ti.err = os.MkdirTemp("", "mptcp-test-images-"); ti.err == nil {
			ti.images, ti.err = BuildImages(builder, ti.dir)
		}
		t.Logf("images of this tree built in %s", time.Since(start).Round(100*time.Millisecond))
	})
	if ti.err != nil {
		t.Fatalf("the images of this tree: %v", ti.err)
	}
	return ti.images
}

// Remove removes the images ForTest built (not those of $MPTCP_TEST_IMAGES).
func (ti *TestImages) Remove() {
	if ti.dir != "" {
		os.RemoveAll(ti.dir)
	}
}
