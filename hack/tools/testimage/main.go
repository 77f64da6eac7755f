// Command testimage packs static binaries into an image archive that
// `ctr images import` accepts, for the test bed's real nodes until `make
// images` (issue 14, item 1) builds the project's images: one layer holding
// the given files, an entrypoint, no base image, nothing pulled.
//
//	testimage -ref ghcr.io/mptcp-operator/pause:testbed -o pause.tar \
//	    -file /pause=bin/pause -entrypoint /pause
//
// It is deliberately small and standalone so that the node package can take
// `make images` output instead without other changes (docs/testbed.md,
// "Real nodes").
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// files collects repeated -file DEST=SRC flags.
type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(v string) error { *f = append(*f, v); return nil }

func main() {
	ref := flag.String("ref", "", "fully qualified image reference (registry/path:tag): containerd names the image after it")
	out := flag.String("o", "", "archive to write")
	entrypoint := flag.String("entrypoint", "", "path of the entrypoint inside the image")
	var fs files
	flag.Var(&fs, "file", "DEST=SRC: put file SRC at DEST in the image, executable (repeatable)")
	flag.Parse()
	if err := run(*ref, *out, *entrypoint, fs); err != nil {
		fmt.Fprintln(os.Stderr, "testimage:", err)
		os.Exit(1)
	}
}

func run(ref, out, entrypoint string, fs files) error {
	if ref == "" || out == "" || entrypoint == "" || len(fs) == 0 {
		return fmt.Errorf("-ref, -o, -entrypoint and at least one -file are required")
	}
	// StrictValidation refuses a name without a registry, which containerd
	// would otherwise prefix with docker.io/.
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return err
	}
	layerTar, err := layer(fs)
	if err != nil {
		return err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{
		Entrypoint: []string{entrypoint},
		Env:        []string{"PATH=/"},
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	return tarball.WriteToFile(out, tag, img)
}

// layer returns an uncompressed tar with every file at its destination, owned
// by root, with a zero modification time so that the same binaries give the
// same layer.
func layer(fs files) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range fs {
		dest, src, ok := strings.Cut(f, "=")
		if !ok || !strings.HasPrefix(dest, "/") {
			return nil, fmt.Errorf("-file %q: want /DEST=SRC", f)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		hdr := &tar.Header{Name: strings.TrimPrefix(dest, "/"), Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
