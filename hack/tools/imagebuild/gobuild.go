package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// buildBinary builds pkg of the module at repo into dir/name as a static
// linux/arch executable whose bytes depend only on the source, the Go
// toolchain and the build's version and revision: no cgo (static, no
// libc), -trimpath (no local paths), -buildvcs=false (no VCS time or dirty
// flag), an empty Go build ID, and no symbol table or DWARF. The version
// and revision go into internal/buildinfo (the binaries' -version flag and
// build_info metric) as the image labels carry them.
//
// With test, it is pkg's test binary (go test -c), not a command.
func buildBinary(repo, pkg, arch, dir, name, version, revision string, test bool) (string, error) {
	out := filepath.Join(dir, name)
	const stamp = "-X github.com/mptcp-operator/mptcp-operator/internal/buildinfo."
	build := []string{"build"}
	if test {
		build = []string{"test", "-c"}
	}
	cmd := exec.Command("go", append(build, "-trimpath", "-buildvcs=false", "-mod=readonly",
		"-ldflags=-s -w -buildid= "+stamp+"version="+version+" "+stamp+"revision="+revision, "-o", out, pkg)...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(),
		"CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch,
		// The caller's GOFLAGS (make exports -mod=mod) must not change the
		// build; the flags above are the whole of it.
		"GOFLAGS=",
		// Baseline instruction sets: a GOAMD64 or GOARM64 left in the
		// environment would otherwise change the code.
		"GOAMD64=v1", "GOARM64=v8.0",
	)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}
