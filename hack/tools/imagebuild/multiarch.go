package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// buildIndexes builds every Go image for each of arches and writes it as one
// OCI image index per image (<out>/<name>.tar), recording the index's digest.
// The C test client, built against this machine's C library, is skipped.
func buildIndexes(record *buildRecord, repo, out, registry, tag, keep, sourceURL, bins string, src source,
	arches []string, images []image) error {
	for _, img := range images {
		if img.cSource != "" {
			fmt.Printf("%-12s skipped: a C program, built for this machine's architecture only\n", img.name)
			continue
		}
		ref, err := name.NewTag(registry+"/"+img.name+":"+tag, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("image %s: %w", img.name, err)
		}
		var per []platformImage
		manifests := map[string]string{}
		for _, arch := range arches {
			dir := filepath.Join(bins, arch)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			binary, _, err := img.build(repo, arch, dir, tag, src.revision)
			if err != nil {
				return err
			}
			if err := keepBinary(keep, binary, img.name, arch); err != nil {
				return err
			}
			image, err := buildImage(img, binary, nil, arch, tag, sourceURL, src)
			if err != nil {
				return fmt.Errorf("image %s: %w", img.name, err)
			}
			d, err := image.Digest()
			if err != nil {
				return err
			}
			manifests["linux/"+arch] = d.String()
			per = append(per, platformImage{arch: arch, image: image})
		}
		idx := buildIndex(per)
		archive := img.name + ".tar"
		if err := writeIndexArchive(filepath.Join(out, archive), ref, idx, per, src.epoch); err != nil {
			return fmt.Errorf("image %s: %w", img.name, err)
		}
		digest, err := idx.Digest()
		if err != nil {
			return err
		}
		platforms := make([]string, len(arches))
		for i, a := range arches {
			platforms[i] = "linux/" + a
		}
		record.Images = append(record.Images, built{
			Name: img.name, Ref: ref.String(), Archive: archive, Digest: digest.String(),
			User: img.user, Platform: strings.Join(platforms, ","), Manifests: manifests,
		})
		fmt.Printf("%-12s %s@%s  %s\n", img.name, ref, digest, filepath.Join(out, archive))
	}
	return nil
}

// keepBinary copies binary to <keep>/<name>_linux_<arch> when keep is set.
func keepBinary(keep, binary, name, arch string) error {
	if keep == "" {
		return nil
	}
	b, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(keep, name+"_linux_"+arch), b, 0o755)
}

// printSourceJSON prints what readSource finds, for tools that stamp other
// artifacts (hack/tools/release) the way the images are stamped.
func printSourceJSON(repo string) error {
	src, err := readSource(repo)
	if err != nil {
		return err
	}
	b, err := json.Marshal(map[string]any{"revision": src.revision, "sourceDateEpoch": src.epoch.Unix()})
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}
