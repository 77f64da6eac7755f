package main

import (
	"encoding/json"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations of the index entry that name the image on import.
const (
	// containerd's importer (ctr images import, kind load image-archive)
	// names the image after this annotation.
	annotationContainerdName = "io.containerd.image.name"
	// The OCI image layout's own name for a manifest: the tag.
	annotationRefName = "org.opencontainers.image.ref.name"
)

// dockerManifest is an entry of a `docker save` archive's manifest.json.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// writeArchive writes img, named ref, as one tar in two layouts over the same
// blobs: an OCI image layout (oci-layout, index.json, blobs/sha256/...), which
// containerd prefers and imports with the manifest as it is, so that the
// digest it reports is the one images.json records; and a `docker save`
// manifest.json, which `docker load` reads. Entries are sorted, owned by 0:0
// and stamped with epoch.
func writeArchive(path string, ref name.Tag, img v1.Image, epoch time.Time) error {
	blobs, err := readImageBlobs(img)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	var entries []fileEntry
	for _, b := range blobs.all() {
		entries = append(entries, blob(b.digest, b.data))
	}
	docker := dockerManifest{Config: blobPath(blobs.config.digest), RepoTags: []string{ref.String()}}
	for _, l := range blobs.layers {
		docker.Layers = append(docker.Layers, blobPath(l.digest))
	}
	top := v1.Descriptor{
		MediaType: types.OCIManifestSchema1,
		Size:      int64(len(blobs.manifest.data)),
		Digest:    blobs.manifest.digest,
		Platform:  &v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture},
	}
	return writeLayout(path, ref, top, entries, map[string]any{"manifest.json": []dockerManifest{docker}}, epoch)
}

// digestedBlob is one blob of an image: its bytes and their digest.
type digestedBlob struct {
	digest v1.Hash
	data   []byte
}

// imageBlobs are what an image layout holds of one image: its manifest, its
// config and its layers (compressed, as a registry serves them).
type imageBlobs struct {
	manifest, config digestedBlob
	layers           []digestedBlob
}

// readImageBlobs reads img's blobs. writeArchive and writeIndexArchive both
// read an image through it, so that a single-architecture archive and each
// image of a multi-architecture one lay out the same bytes in the same order.
func readImageBlobs(img v1.Image) (imageBlobs, error) {
	var out imageBlobs
	var err error
	if out.manifest.data, err = img.RawManifest(); err != nil {
		return out, err
	}
	if out.manifest.digest, err = img.Digest(); err != nil {
		return out, err
	}
	if out.config.data, err = img.RawConfigFile(); err != nil {
		return out, err
	}
	if out.config.digest, err = img.ConfigName(); err != nil {
		return out, err
	}
	layers, err := img.Layers()
	if err != nil {
		return out, err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return out, err
		}
		b, err := readLayer(l)
		if err != nil {
			return out, err
		}
		out.layers = append(out.layers, digestedBlob{digest: d, data: b})
	}
	return out, nil
}

// readLayer is the layer's compressed bytes.
func readLayer(l v1.Layer) ([]byte, error) {
	rc, err := l.Compressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// all are the blobs in the order an archive lists them: manifest, config,
// layers.
func (b imageBlobs) all() []digestedBlob {
	return append([]digestedBlob{b.manifest, b.config}, b.layers...)
}

// writeLayout finishes an OCI image layout archive holding entries (the
// blobs): the directories of blobs, an index.json whose one entry is top,
// named ref for containerd's importer and the layout, an oci-layout, and the
// JSON files of extra (by name); one tar, entries sorted, owned by 0:0 and
// stamped with epoch, written atomically.
func writeLayout(path string, ref name.Tag, top v1.Descriptor, entries []fileEntry, extra map[string]any,
	epoch time.Time) error {
	top.Annotations = map[string]string{
		annotationContainerdName: ref.String(),
		annotationRefName:        ref.TagStr(),
	}
	files := map[string]any{
		"index.json": v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{top}},
		"oci-layout": map[string]string{"imageLayoutVersion": "1.0.0"},
	}
	maps.Copy(files, extra)
	entries = append(entries,
		fileEntry{name: "blobs/", mode: 0o755, dir: true},
		fileEntry{name: "blobs/sha256/", mode: 0o755, dir: true})
	for _, name := range slices.Sorted(maps.Keys(files)) {
		b, err := json.Marshal(files[name])
		if err != nil {
			return err
		}
		entries = append(entries, fileEntry{name: name, mode: 0o644, data: b})
	}
	b, err := tarEntries(entries, epoch)
	if err != nil {
		return err
	}
	return writeFileAtomic(path, b)
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

func blob(h v1.Hash, b []byte) fileEntry {
	return fileEntry{name: blobPath(h), mode: 0o644, data: b}
}

// writeFileAtomic replaces path with b, so that a reader never sees half an
// archive and an interrupted build leaves the previous one.
func writeFileAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
