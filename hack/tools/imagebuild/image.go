package main

import (
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// labels are the OCI annotation keys the images carry as labels
// (github.com/opencontainers/image-spec annotations.md).
const (
	labelSource      = "org.opencontainers.image.source"
	labelRevision    = "org.opencontainers.image.revision"
	labelVersion     = "org.opencontainers.image.version"
	labelTitle       = "org.opencontainers.image.title"
	labelDescription = "org.opencontainers.image.description"
)

// buildImage puts the binary and the shared objects it loads on an empty
// base (OCI media types, nothing pulled) with the image's user, entry point
// and labels.
func buildImage(img image, binary string, shared []fileEntry, arch, version, sourceURL string, src source) (v1.Image, error) {
	layer, err := binaryLayer(binary, img.name, shared, src.epoch)
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	created := v1.Time{Time: src.epoch}
	withLayer, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: created, CreatedBy: "imagebuild: " + img.buildCommand()},
	})
	if err != nil {
		return nil, err
	}
	cfg, err := withLayer.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture = arch
	cfg.OS = "linux"
	cfg.Created = created
	cfg.Config = v1.Config{
		Entrypoint: []string{"/" + binDir + img.name},
		Env:        []string{"PATH=/" + binDir[:len(binDir)-1]},
		User:       img.user,
		WorkingDir: "/",
		Labels: map[string]string{
			labelSource:      sourceURL,
			labelRevision:    src.revision,
			labelVersion:     version,
			labelTitle:       img.name,
			labelDescription: img.description,
		},
	}
	return mutate.ConfigFile(withLayer, cfg)
}
