package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// source is what the images say about the tree they were built from.
type source struct {
	// revision is the commit, or "<commit>-dirty-<hash>" when the tree has
	// changes: hash covers every changed, deleted and untracked (not
	// ignored) file, so the same dirty tree gives the same revision, and so
	// the same digest.
	revision string
	// epoch stamps every file and the image's creation time:
	// SOURCE_DATE_EPOCH if set (reproducible-builds.org), else the commit
	// time.
	epoch time.Time
}

func readSource(repo string) (source, error) {
	commit, err := git(repo, "rev-parse", "HEAD")
	if err != nil {
		return source{}, err
	}
	commit = strings.TrimSpace(commit)
	s := source{revision: commit}
	changed, err := git(repo, "ls-files", "-z", "--modified", "--deleted", "--others", "--exclude-standard")
	if err != nil {
		return source{}, err
	}
	if changed != "" {
		h, err := hashFiles(repo, strings.Split(strings.TrimSuffix(changed, "\x00"), "\x00"))
		if err != nil {
			return source{}, err
		}
		s.revision = commit + "-dirty-" + h
	}
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		if epoch, err = git(repo, "log", "-1", "--format=%ct", "HEAD"); err != nil {
			return source{}, err
		}
	}
	secs, err := strconv.ParseInt(strings.TrimSpace(epoch), 10, 64)
	if err != nil {
		return source{}, fmt.Errorf("SOURCE_DATE_EPOCH or commit time %q: %w", epoch, err)
	}
	s.epoch = time.Unix(secs, 0).UTC()
	return s, nil
}

// hashFiles returns the first 12 hex digits of a SHA-256 over the paths (in
// order, each once) and their contents, a deleted file counting as such.
func hashFiles(repo string, paths []string) (string, error) {
	sort.Strings(paths)
	h := sha256.New()
	last := ""
	for _, p := range paths {
		if p == last { // a modified file that is also deleted is listed twice
			continue
		}
		last = p
		b, err := os.ReadFile(filepath.Join(repo, p))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			fmt.Fprintf(h, "deleted %q\n", p)
		case err != nil:
			return "", err
		default:
			fmt.Fprintf(h, "file %q %d\n", p, len(b))
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

func git(repo string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = repo
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}
