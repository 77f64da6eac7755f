// Package benchdoc writes benchmark results into docs/benchmarks.md, one
// "## " section per benchmark, so that each benchmark rewrites its own
// section and leaves the others' alone.
package benchdoc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"regexp"
	"strings"
)

// ReplaceSection replaces the section that starts with the line heading
// (e.g. "## Controller convergence") with body, which must start with that
// heading; a missing section is appended and a missing file created. The
// body's prose is wrapped to MaxLineChars (Wrap); a line still longer (a
// table row) is written, so that a run's figures are not lost, and
// returned as an error, as the docs' test would refuse it.
func ReplaceSection(path, heading, body string) error {
	body = Wrap(body)
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	text := string(old)
	if text == "" {
		text = "# Benchmarks\n\n"
	}
	re := regexp.MustCompile(`(?ms)^` + regexp.QuoteMeta(heading) + `\n.*?(^## |\z)`)
	if loc := re.FindStringSubmatchIndex(text); loc != nil {
		rest := text[loc[2]:]
		sep := "\n"
		if loc[2] == loc[3] {
			rest, sep = "", ""
		}
		text = text[:loc[0]] + body + sep + rest
	} else {
		text = strings.TrimRight(text, "\n") + "\n\n" + body
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return err
	}
	if long := LongLines(body); len(long) > 0 {
		return fmt.Errorf("%s, section %q: lines over %d characters (narrow the table): %s",
			path, heading, MaxLineChars, strings.Join(long, "; "))
	}
	return nil
}

// CPUModel is the machine's CPU as /proc/cpuinfo names it.
func CPUModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// KernelRelease is the running kernel's release (uname -r).
func KernelRelease() string {
	out, err := exec.Command("uname", "-r").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
