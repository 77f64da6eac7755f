// Command release writes everything a release publishes into one directory:
// the packaged chart, the product images as multi-architecture OCI image
// indexes, the kubectl plugin's archives for linux and darwin on amd64 and
// arm64 with their krew manifest, a CycloneDX SBOM per image and per binary,
// and SHA256SUMS over every file. The same tree gives the same bytes.
//
//	release -version 0.7.0 -out _output/release -imagebuild IMAGEBUILD -helm HELM -cyclonedx CYCLONEDX_GOMOD
//
// With -krew it only builds the plugin for this machine into -bin and its
// archive and krew manifest into -out (`make kubectl-mptcp`).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"sigs.k8s.io/yaml"
)

// images are the product's images and the two the chart's helm test needs.
const images = "controller,agent,traffic,conformance"

// imageArches and pluginPlatforms are what a release builds for.
var (
	imageArches     = "amd64,arm64"
	pluginPlatforms = []platform{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}}
)

func main() {
	repo := flag.String("repo", ".", "root of the mptcp-operator repository")
	out := flag.String("out", "_output/release", "directory the release is written to (emptied first)")
	version := flag.String("version", "", "the release's version: must be the chart's version")
	imagebuild := flag.String("imagebuild", "", "hack/tools/imagebuild binary")
	helm := flag.String("helm", "", "helm binary")
	cyclonedx := flag.String("cyclonedx", "", "cyclonedx-gomod binary")
	krew := flag.Bool("krew", false, "only the plugin for this machine: binary into -bin, archive and manifest into -out")
	bin := flag.String("bin", "bin", "with -krew, where the plugin binary goes")
	flag.Parse()
	var err error
	if *krew {
		err = krewOnly(*repo, *out, *bin, *imagebuild)
	} else {
		err = release(*repo, *out, *version, *imagebuild, *helm, *cyclonedx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

// chartMeta is what the release reads of Chart.yaml.
type chartMeta struct {
	Name       string `json:"name"`
	Version    string `json:"version"`
	AppVersion string `json:"appVersion"`
}

const chartDir = "charts/mptcp-operator"

func readChart(repo string) (chartMeta, error) {
	var c chartMeta
	b, err := os.ReadFile(filepath.Join(repo, chartDir, "Chart.yaml"))
	if err != nil {
		return c, err
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		return c, err
	}
	if c.Name == "" || c.Version == "" || c.AppVersion == "" {
		return c, fmt.Errorf("%s/Chart.yaml lacks name, version or appVersion", chartDir)
	}
	return c, nil
}

// stamp is the revision and time every artifact carries: imagebuild's, so
// that the plugin and the images agree.
type stamp struct {
	Revision        string `json:"revision"`
	SourceDateEpoch int64  `json:"sourceDateEpoch"`
}

func readStamp(repo, imagebuild string) (stamp, error) {
	var s stamp
	cmd := exec.Command(imagebuild, "-repo", repo, "-print-source")
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return s, fmt.Errorf("%s -print-source: %w", imagebuild, err)
	}
	return s, json.Unmarshal(b, &s)
}

// openSource reads what both kinds of release start from: the repository's
// absolute root, its chart and the stamp of its sources.
func openSource(repo, imagebuild string) (root string, chart chartMeta, st stamp, err error) {
	if root, err = filepath.Abs(repo); err != nil {
		return "", chart, st, err
	}
	if chart, err = readChart(root); err != nil {
		return "", chart, st, err
	}
	st, err = readStamp(root, imagebuild)
	return root, chart, st, err
}

func release(repo, out, version, imagebuild, helm, cyclonedx string) error {
	if imagebuild == "" || helm == "" || cyclonedx == "" {
		return fmt.Errorf("-imagebuild, -helm and -cyclonedx are required")
	}
	repo, chart, st, err := openSource(repo, imagebuild)
	if err != nil {
		return err
	}
	if version != chart.Version {
		return fmt.Errorf("VERSION=%q is not the chart's version %s (%s/Chart.yaml): a release is the chart's "+
			"version; run make release VERSION=%s, or bump the chart's version and digest first",
			version, chart.Version, chartDir, chart.Version)
	}
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "release-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	if err := packageChart(repo, helm, out, st); err != nil {
		return err
	}
	bins := filepath.Join(work, "bin")
	if err := buildImages(repo, imagebuild, out, bins); err != nil {
		return err
	}
	plugins, err := buildPlugins(repo, work, out, chart, st, pluginPlatforms)
	if err != nil {
		return err
	}
	if err := writeKrewManifest(out, chart, plugins); err != nil {
		return err
	}
	if err := writeSBOMs(repo, cyclonedx, bins, plugins, out, chart.AppVersion); err != nil {
		return err
	}
	return writeSums(out)
}

// krewOnly builds the plugin for this machine (`make kubectl-mptcp`).
func krewOnly(repo, out, bin, imagebuild string) error {
	repo, chart, st, err := openSource(repo, imagebuild)
	if err != nil {
		return err
	}
	for _, d := range []string{out, bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	plugins, err := buildPlugins(repo, bin, out, chart, st, []platform{{runtime.GOOS, runtime.GOARCH}})
	if err != nil {
		return err
	}
	if err := os.Rename(plugins[0].binary, filepath.Join(bin, "kubectl-mptcp")); err != nil {
		return err
	}
	fmt.Println(filepath.Join(bin, "kubectl-mptcp"))
	return writeKrewManifest(out, chart, plugins)
}
