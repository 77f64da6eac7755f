package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

type platform struct{ goos, goarch string }

func (p platform) String() string { return p.goos + "_" + p.goarch }

// plugin is one platform's kubectl-mptcp: the binary and its archive.
type plugin struct {
	platform
	binary  string
	archive string // file name under the output directory
	sha256  string
}

// buildPlugins builds cmd/kubectl-mptcp for each platform into work and its
// krew archive into out.
func buildPlugins(repo, work, out string, chart chartMeta, st stamp, platforms []platform) ([]plugin, error) {
	license, err := os.ReadFile(filepath.Join(repo, "LICENSE"))
	if err != nil {
		return nil, err
	}
	var plugins []plugin
	for _, p := range platforms {
		binary := filepath.Join(work, "kubectl-mptcp_"+p.String())
		if err := goBuild(repo, p, binary, chart.AppVersion, st.Revision); err != nil {
			return nil, err
		}
		exe, err := os.ReadFile(binary)
		if err != nil {
			return nil, err
		}
		b, err := tarGz([]tarFile{{"kubectl-mptcp", 0o755, exe}, {"LICENSE", 0o644, license}},
			time.Unix(st.SourceDateEpoch, 0))
		if err != nil {
			return nil, err
		}
		name := "kubectl-mptcp_" + p.String() + ".tar.gz"
		if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
			return nil, err
		}
		sum := sha256.Sum256(b)
		plugins = append(plugins, plugin{platform: p, binary: binary, archive: name, sha256: hex.EncodeToString(sum[:])})
		fmt.Printf("%-12s %s sha256 %x\n", "plugin", filepath.Join(out, name), sum)
	}
	return plugins, nil
}

// goBuild builds the plugin as imagebuild builds the images' binaries:
// static, -trimpath, no VCS stamp or build ID, baseline instruction sets, so
// that its bytes depend on the source, the toolchain, version and revision.
func goBuild(repo string, p platform, out, version, revision string) error {
	const x = "-X github.com/mptcp-operator/mptcp-operator/internal/buildinfo."
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-mod=readonly",
		"-ldflags=-s -w -buildid= "+x+"version="+version+" "+x+"revision="+revision, "-o", out, "./cmd/kubectl-mptcp")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.goos, "GOARCH="+p.goarch, "GOFLAGS=",
		"GOAMD64=v1", "GOARM64=v8.0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build kubectl-mptcp %s: %w\n%s", p, err, b)
	}
	return nil
}

type tarFile struct {
	name string
	mode int64
	data []byte
}

// tarGz writes files, in the order given, owned by 0:0 with no user or group
// names and stamped with mtime, gzipped with an empty header: the same files
// give the same bytes.
func tarGz(files []tarFile, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	for _, f := range files {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.data)),
			ModTime: mtime.UTC(), Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
