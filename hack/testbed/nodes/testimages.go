package nodes

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/mptcp-operator/mptcp-operator/internal/controller/testenv"
)

// Images that BuildTestImages makes. They stand in for `make images` (issue
// 14, item 1) until it lands; then a test passes that target's archives and
// references instead, and this file and hack/tools/testimage go away.
const (
	TestPauseImage   = "ghcr.io/mptcp-operator/pause:testbed"
	TestTrafficImage = "ghcr.io/mptcp-operator/traffic:testbed"
)

// BuildTestImages builds the pause and traffic images into dir: static
// binaries (hack/traffic; hack/tools/testimage/pause) packed by
// hack/tools/testimage, each alone on an empty base. It returns them, the
// pause image first.
func BuildTestImages(dir string) ([]Image, error) {
	root := testenv.RepoRoot()
	tools := filepath.Join(root, "hack", "tools")
	build := func(moduleDir, out, pkg string) error {
		cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
		cmd.Dir = moduleDir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
		}
		return nil
	}
	bins := map[string]string{}
	for _, b := range []struct{ name, module, pkg string }{
		{"traffic", root, "./hack/traffic"},
		{"pause", tools, "./testimage/pause"},
		{"testimage", tools, "./testimage"},
	} {
		bins[b.name] = filepath.Join(dir, b.name)
		if err := build(b.module, bins[b.name], b.pkg); err != nil {
			return nil, err
		}
	}
	images := []Image{
		{Ref: TestPauseImage, Archive: filepath.Join(dir, "pause.tar")},
		{Ref: TestTrafficImage, Archive: filepath.Join(dir, "traffic.tar")},
	}
	for _, im := range images {
		name := filepath.Base(im.Archive[:len(im.Archive)-len(".tar")])
		out, err := exec.Command(bins["testimage"], "-ref", im.Ref, "-o", im.Archive,
			"-file", "/"+name+"="+bins[name], "-entrypoint", "/"+name).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("testimage %s: %w\n%s", im.Ref, err, out)
		}
	}
	return images, nil
}
