package main

import (
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// platformImage is one architecture's image of a multi-architecture build.
type platformImage struct {
	arch  string
	image v1.Image
}

// buildIndex puts one image per architecture, in the order given, into an OCI
// image index whose entries carry each image's platform: what a registry
// serves for a multi-architecture reference.
func buildIndex(images []platformImage) v1.ImageIndex {
	var adds []mutate.IndexAddendum
	for _, p := range images {
		adds = append(adds, mutate.IndexAddendum{
			Add: p.image,
			Descriptor: v1.Descriptor{
				MediaType: types.OCIManifestSchema1,
				Platform:  &v1.Platform{OS: "linux", Architecture: p.arch},
			},
		})
	}
	base := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	return mutate.AppendManifests(base, adds...)
}

// writeIndexArchive writes idx, named ref, as an OCI image layout in one tar
// (oci-layout, index.json naming the image index, blobs/sha256/...): `skopeo
// copy --all oci-archive:...` and `crane push --index` (on the unpacked
// layout) push it with the digests images.json records. Entries are sorted,
// owned by 0:0 and stamped with epoch, as writeArchive's.
func writeIndexArchive(path string, ref name.Tag, idx v1.ImageIndex, images []platformImage, epoch time.Time) error {
	raw, err := idx.RawManifest()
	if err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	entries := []fileEntry{blob(digest, raw)}
	seen := map[v1.Hash]bool{digest: true}
	add := func(h v1.Hash, b []byte) {
		if !seen[h] {
			seen[h] = true
			entries = append(entries, blob(h, b))
		}
	}
	for _, p := range images {
		blobs, err := readImageBlobs(p.image)
		if err != nil {
			return err
		}
		for _, b := range blobs.all() {
			add(b.digest, b.data)
		}
	}
	top := v1.Descriptor{MediaType: types.OCIImageIndex, Size: int64(len(raw)), Digest: digest}
	return writeLayout(path, ref, top, entries, nil, epoch)
}
