package main

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// buildCProgram compiles the C program src of the repository at repo into
// dir/name with clang, linked dynamically against the build machine's C
// library: the kind of program the preload library serves, which a static
// binary is not. No debug information, so that the bytes depend only on
// the source, the compiler and the C library's headers.
func buildCProgram(repo, src, dir, name string) (string, error) {
	out := filepath.Join(dir, name)
	cmd := exec.Command("clang", "-O2", "-Wall", "-o", out, src)
	cmd.Dir = repo
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("clang %s: %w\n%s", src, err, b)
	}
	return out, nil
}

// sharedObjects are the files a dynamically linked program needs to start
// in an otherwise empty image: its program interpreter, at the path the
// program names, and every library it needs, directly or through another
// library, where the linker found it (clang -print-file-name), which is
// one of the dynamic loader's default directories. Each entry holds the
// file's bytes, not a symbolic link.
func sharedObjects(program string) ([]fileEntry, error) {
	var entries []fileEntry
	seen := map[string]bool{}
	add := func(path string) error {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		entries = append(entries, fileEntry{name: strings.TrimPrefix(path, "/"), mode: 0o755, data: data})
		return nil
	}
	queue := []string{program}
	for len(queue) > 0 {
		f, err := elf.Open(queue[0])
		if err != nil {
			return nil, err
		}
		interp, needed, err := dynamicDeps(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", queue[0], err)
		}
		queue = queue[1:]
		if interp != "" && !seen[filepath.Base(interp)] {
			seen[filepath.Base(interp)] = true
			if err := add(interp); err != nil {
				return nil, err
			}
		}
		for _, lib := range needed {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			out, err := exec.Command("clang", "-print-file-name="+lib).Output()
			if err != nil {
				return nil, fmt.Errorf("asking clang where %s is: %w", lib, err)
			}
			// clang prints the name back when it finds no such file.
			path := strings.TrimSpace(string(out))
			if !filepath.IsAbs(path) {
				return nil, fmt.Errorf("the linker does not find %s, which %s needs", lib, program)
			}
			if err := add(path); err != nil {
				return nil, err
			}
			queue = append(queue, path)
		}
	}
	return entries, nil
}

// dynamicDeps reads an ELF file's program interpreter (PT_INTERP) and the
// libraries it names as needed (DT_NEEDED).
func dynamicDeps(f *elf.File) (interp string, needed []string, err error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return "", nil, err
		}
		interp = strings.TrimRight(string(b), "\x00")
	}
	needed, err = f.ImportedLibraries()
	return interp, needed, err
}
