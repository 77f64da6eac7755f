package nodes

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// Images are the image archives `make images` (hack/tools/imagebuild)
// writes, by image name (controller, agent, traffic, pause), as its
// images.json lists them.
type Images map[string]Image

// Names of the images real nodes and their tests use.
const (
	PauseImage   = "pause"
	TrafficImage = "traffic"
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
