package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
)

// writeSBOMs writes <binary>.cdx.json, a CycloneDX SBOM of each image's
// binary per architecture and of each plugin binary, from the module graph
// the Go toolchain embedded in it (cyclonedx-gomod bin), without serial
// number or timestamp so that it is reproducible.
func writeSBOMs(cyclonedx, imageBins string, plugins []plugin, out, version string) error {
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
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("cyclonedx-gomod bin %s: %w\n%s", bin, err, b)
		}
	}
	return nil
}
