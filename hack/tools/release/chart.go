package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// packageChart runs helm package with SOURCE_DATE_EPOCH set: helm then
// stamps every entry with it instead of the files' times, so the archive's
// bytes depend on the chart's content only (the release test checks it).
func packageChart(repo, helm, out string, st stamp) error {
	cmd := exec.Command(helm, "package", filepath.Join(repo, chartDir), "--destination", out)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.FormatInt(st.SourceDateEpoch, 10))
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("helm package: %w\n%s", err, b)
	}
	return nil
}

// buildImages writes the images as OCI image indexes (imagebuild -arch with
// several architectures) and keeps their binaries in bins for the SBOMs.
func buildImages(repo, imagebuild, out, bins string) error {
	cmd := exec.Command(imagebuild, "-repo", repo, "-out", out, "-arch", imageArches, "-images", images, "-bins", bins)
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("imagebuild: %w", err)
	}
	return nil
}
