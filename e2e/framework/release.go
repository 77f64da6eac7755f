package framework

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BuildRelease builds cmd/agent as it was at commit into dir/agent-<commit>
// and returns the binary's path. The source comes from `git archive` of the
// repository the tests run in (nothing is checked out or registered in it);
// the binary lives only in dir. errNoHistory says the commit is not there
// (a shallow clone, an exported tarball).
func BuildRelease(dir, commit string) (string, error) {
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("%w: not in a git checkout: %w", ErrNoHistory, err)
	}
	repo := strings.TrimSpace(string(top))
	if err := exec.Command("git", "-C", repo, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		return "", fmt.Errorf("%w: commit %s is not in %s (shallow clone?)", ErrNoHistory, commit, repo)
	}
	src := filepath.Join(dir, "src-"+commit)
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", repo, commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		return "", fmt.Errorf("extracting %s: %w\n%s", commit, err, out)
	}
	bin := filepath.Join(dir, "agent-"+commit)
	build := exec.Command("go", "build", "-o", bin, "./cmd/agent")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the agent of %s: %w\n%s", commit, err, out)
	}
	return bin, os.RemoveAll(src)
}

// ErrNoHistory says the git history a test needs is missing.
var ErrNoHistory = fmt.Errorf("git history unavailable")
