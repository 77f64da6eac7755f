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

// BuildChartRelease builds the Helm chart and the images of commit, as that
// commit's `make images` would have: the source is a clone of the
// repository the tests run in at that commit (sharing its objects: nothing
// is checked out, added or registered in the repository itself), built with
// builder (this tree's image builder, IMAGEBUILD) into dir/images with tag,
// so that the release's images do not replace this tree's (tagged with the
// chart's appVersion, which may be the same) on a node. It returns the
// release's chart directory and its images directory (images.json).
func BuildChartRelease(dir, commit, builder, tag string) (chart, images string, err error) {
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", "", fmt.Errorf("%w: not in a git checkout: %w", ErrNoHistory, err)
	}
	repo := strings.TrimSpace(string(top))
	if err := exec.Command("git", "-C", repo, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		return "", "", fmt.Errorf("%w: commit %s is not in %s (shallow clone?)", ErrNoHistory, commit, repo)
	}
	src := filepath.Join(dir, "src-"+commit)
	for _, args := range [][]string{
		{"clone", "--quiet", "--shared", "--no-checkout", repo, src},
		{"-C", src, "checkout", "--quiet", "--detach", commit},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("git %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	}
	images = filepath.Join(dir, "images-"+commit)
	// The images every release has had: an older tree lacks the sources
	// of images added since.
	if out, err := exec.Command(builder, "-repo", src, "-out", images, "-tag", tag, "-images", "controller,agent,traffic,pause").CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("building the images of %s: %w\n%s", commit, err, out)
	}
	return filepath.Join(src, "charts", "mptcp-operator"), images, nil
}
