package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// testImage is the image whose binary is a test binary.
const testImage = "conformance"

// writeSBOMs writes <binary>.cdx.json, a CycloneDX SBOM of each image's
// binary per architecture and of each plugin binary, from the module graph
// the Go toolchain embedded in it (cyclonedx-gomod bin), without serial
// number or timestamp so that it is reproducible. A test binary (the
// conformance image's, go test -c) embeds no module list: its SBOM is the
// module's graph with test dependencies (cyclonedx-gomod mod -test), a
// superset of what it links.
func writeSBOMs(repo, cyclonedx, imageBins string, plugins []plugin, out, version string) error {
	entries, err := os.ReadDir(imageBins)
	if err != nil {
		return err
	}
	var bins []string
	for _, e := range entries {
		bins = append(bins, filepath.Join(imageBins, e.Name()))
	}
	for _, p := range plugins {
		bins = append(bins, p.binary)
	}
	sort.Strings(bins)
	for _, bin := range bins {
		dst := filepath.Join(out, filepath.Base(bin)+".cdx.json")
		cmd := exec.Command(cyclonedx, "bin", "-json", "-noserial", "-notimestamp", "-version", "v"+version,
			"-output", dst, bin)
		if strings.HasPrefix(filepath.Base(bin), testImage+"_") {
			cmd = exec.Command(cyclonedx, "mod", "-json", "-noserial", "-notimestamp", "-test", "-output", dst, repo)
			cmd.Env = append(os.Environ(), "GOFLAGS=")
		}
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("cyclonedx-gomod bin %s: %w\n%s", bin, err, b)
		}
	}
	return nil
}
