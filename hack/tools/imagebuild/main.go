// Command imagebuild builds the project's container images without a
// container engine or a registry: each image is one static Go binary on an
// empty base (the C test client's, a program with its C library), written as an archive that `ctr images import`, `kind load
// image-archive` and `docker load` accept. The same source and Go toolchain
// give the same bytes, hence the same digests (docs/install.md#images).
//
//	imagebuild -repo . -out _output/images
//
// writes <out>/<name>.tar for the controller, the agent, the traffic tool,
// the C test client and the test bed's pause image, and <out>/images.json with every image's
// reference and digest.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"golang.org/x/mod/modfile"
	"sigs.k8s.io/yaml"
)

// built is what images.json records of an image.
type built struct {
	Name string `json:"name"`
	// Ref is the fully qualified reference the chart uses by default.
	Ref string `json:"ref"`
	// Archive is the file name under the output directory.
	Archive string `json:"archive"`
	// Digest is the manifest's digest: the one a registry and containerd
	// report after `crane push` or `ctr images import`.
	Digest string `json:"digest"`
	// ImageID is the config's digest (what `docker images` shows).
	ImageID  string `json:"imageID,omitempty"`
	User     string `json:"user"`
	Platform string `json:"platform"`
	// Manifests are, for an image index, each platform's manifest digest.
	Manifests map[string]string `json:"manifests,omitempty"`
}

// buildRecord is images.json.
type buildRecord struct {
	GoVersion       string  `json:"goVersion"`
	Revision        string  `json:"revision"`
	SourceDateEpoch int64   `json:"sourceDateEpoch"`
	Images          []built `json:"images"`
}

func main() {
	repo := flag.String("repo", ".", "root of the mptcp-operator repository")
	out := flag.String("out", "_output/images", "directory for the archives and images.json")
	registry := flag.String("registry", "ghcr.io/mptcp-operator", "registry and path the image names go under")
	chart := flag.String("chart", "charts/mptcp-operator", "chart (relative to -repo) whose appVersion tags the images")
	tag := flag.String("tag", "", "tag of every image (default: the chart's appVersion)")
	arch := flag.String("arch", runtime.GOARCH, "GOARCH of the binaries and the images' platform; several, "+
		"comma-separated, make each archive an OCI image index with one image per architecture (Go images only)")
	keep := flag.String("bins", "", "also copy every image's binary to <bins>/<name>_linux_<arch> (for SBOMs)")
	printSource := flag.Bool("print-source", false, "print the revision and SOURCE_DATE_EPOCH the images "+
		"would carry, as JSON, and build nothing")
	only := flag.String("images", "", "comma-separated names of the images to build (default: all); "+
		"an older tree lacks the sources of images added since")
	flag.Parse()
	selected, err := selectImages(*only)
	if err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(2)
	}
	if *printSource {
		err = printSourceJSON(*repo)
	} else {
		err = run(*repo, *out, *registry, *chart, *tag, *arch, *keep, selected)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

func run(repo, out, registry, chart, tag, arch, keep string, images []image) error {
	repo, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	if tag == "" {
		if tag, err = appVersion(filepath.Join(repo, chart, "Chart.yaml")); err != nil {
			return err
		}
	}
	sourceURL, err := sourceURL(repo)
	if err != nil {
		return err
	}
	src, err := readSource(repo)
	if err != nil {
		return err
	}
	goVersion, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		return fmt.Errorf("go env GOVERSION: %w", err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	bins, err := os.MkdirTemp("", "imagebuild-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bins)

	if keep != "" {
		if err := os.MkdirAll(keep, 0o755); err != nil {
			return err
		}
	}
	record := buildRecord{GoVersion: strings.TrimSpace(string(goVersion)), Revision: src.revision, SourceDateEpoch: src.epoch.Unix()}
	if arches := strings.Split(arch, ","); len(arches) > 1 {
		if err := buildIndexes(&record, repo, out, registry, tag, keep, sourceURL, bins, src, arches, images); err != nil {
			return err
		}
		return writeRecord(out, record)
	}
	for _, img := range images {
		ref, err := name.NewTag(registry+"/"+img.name+":"+tag, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("image %s: %w", img.name, err)
		}
		if img.cSource != "" && arch != runtime.GOARCH {
			// clang would need the other architecture's C library.
			fmt.Printf("%-12s skipped: a C program, built for this machine's architecture (%s) only\n", img.name, runtime.GOARCH)
			continue
		}
		binary, shared, err := img.build(repo, arch, bins, tag, src.revision)
		if err != nil {
			return err
		}
		if err := keepBinary(keep, binary, img.name, arch); err != nil {
			return err
		}
		image, err := buildImage(img, binary, shared, arch, tag, sourceURL, src)
		if err != nil {
			return fmt.Errorf("image %s: %w", img.name, err)
		}
		archive := img.name + ".tar"
		if err := writeArchive(filepath.Join(out, archive), ref, image, src.epoch); err != nil {
			return fmt.Errorf("image %s: %w", img.name, err)
		}
		digest, err := image.Digest()
		if err != nil {
			return err
		}
		id, err := image.ConfigName()
		if err != nil {
			return err
		}
		record.Images = append(record.Images, built{
			Name: img.name, Ref: ref.String(), Archive: archive, Digest: digest.String(), ImageID: id.String(),
			User: img.user, Platform: "linux/" + arch,
		})
		fmt.Printf("%-12s %s@%s  %s\n", img.name, ref, digest, filepath.Join(out, archive))
	}
	return writeRecord(out, record)
}

// writeRecord writes images.json.
func writeRecord(out string, record buildRecord) error {
	b, err := json.MarshalIndent(record, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(out, "images.json"), append(b, '\n'))
}

// appVersion is the chart's appVersion: the images are tagged with it so that
// the chart's default references name what `make images` built.
func appVersion(chartYAML string) (string, error) {
	b, err := os.ReadFile(chartYAML)
	if err != nil {
		return "", err
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		return "", fmt.Errorf("%s: %w", chartYAML, err)
	}
	if c.AppVersion == "" {
		return "", fmt.Errorf("%s has no appVersion", chartYAML)
	}
	return c.AppVersion, nil
}

// sourceURL is the repository's address, from its module path.
func sourceURL(repo string) (string, error) {
	b, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	if err != nil {
		return "", err
	}
	mod := modfile.ModulePath(b)
	if mod == "" {
		return "", fmt.Errorf("%s/go.mod names no module", repo)
	}
	return "https://" + mod, nil
}
