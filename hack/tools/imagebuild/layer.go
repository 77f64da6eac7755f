package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// binDir is where the binary lives in the image.
const binDir = "usr/local/bin/"

// fileEntry is one entry of a layer's tar.
type fileEntry struct {
	name string
	mode int64
	dir  bool
	data []byte
}

// binaryLayer is the image's only layer: the binary, the shared objects it
// loads (none for a static binary), their parent directories and a
// world-writable /tmp (for os.TempDir), in name order, every entry owned by
// 0:0 and stamped with epoch, so that the same files always give the same
// bytes.
func binaryLayer(binary, name string, shared []fileEntry, epoch time.Time) (v1.Layer, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	entries := withParents(append([]fileEntry{
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: binDir + name, mode: 0o755, data: data},
	}, shared...))
	b, err := tarEntries(entries, epoch)
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(
		func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer),
		// compress/gzip writes no time or name into its header: the same
		// tar always compresses to the same bytes with the same Go. The
		// default level: the best one saves 1 % for three times the time.
		tarball.WithCompressionLevel(gzip.DefaultCompression),
	)
}

// withParents adds a directory entry for every parent of the entries
// that has none.
func withParents(entries []fileEntry) []fileEntry {
	have := map[string]bool{}
	for _, e := range entries {
		have[e.name] = true
	}
	out := entries
	for _, e := range entries {
		for dir := path.Dir(strings.TrimSuffix(e.name, "/")); dir != "."; dir = path.Dir(dir) {
			if !have[dir+"/"] {
				have[dir+"/"] = true
				out = append(out, fileEntry{name: dir + "/", mode: 0o755, dir: true})
			}
		}
	}
	return out
}

// tarEntries writes entries sorted by name with fixed owners and times.
func tarEntries(entries []fileEntry, epoch time.Time) ([]byte, error) {
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Name:    e.name,
			Mode:    e.mode,
			ModTime: epoch,
			Format:  tar.FormatUSTAR,
		}
		if e.dir {
			hdr.Typeflag = tar.TypeDir
		} else {
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
