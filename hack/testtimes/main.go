// Command testtimes reads `go test -json` and tells where a test run's time
// went: with -stream it copies the tests' own output to stdout as it comes
// (what `go test` without -json prints, so a reader and CI see the usual
// lines) while the JSON goes to a file; with -report it prints the slowest
// tests and the time of every package from that file.
//
//	go test -json ./... | testtimes -stream -json out.json
//	testtimes -report out.json
//	testtimes -failures out.json  # the last lines each failed test printed
//	testtimes -counts out.json    # "tests: N passed, N failed, N skipped"
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

func main() {
	stream := flag.Bool("stream", false, "copy the output of the JSON on stdin to stdout, and the JSON itself to -json")
	jsonOut := flag.String("json", "", "with -stream: the file to write the JSON to")
	report := flag.String("report", "", "print the slowest tests and the time per package of this JSON file")
	counts := flag.String("counts", "", "print one line with how many tests of this JSON file passed, failed and were skipped")
	failures := flag.String("failures", "", "print the last lines of what each failed test of this JSON file printed")
	lines := flag.Int("lines", 6, "with -failures: how many of a failed test's last messages to print (CI shows only the end of a log)")
	top := flag.Int("top", 20, "with -report: how many of the slowest tests to list")
	areas := flag.String("areas", "", "with -report: a package (./test/e2e) whose top-level tests are areas: its tests are their subtests")
	flag.Parse()

	var err error
	switch {
	case *stream && *jsonOut != "":
		err = copyStream(os.Stdin, os.Stdout, *jsonOut)
	case *report != "":
		err = printReport(os.Stdout, *report, *top, *areas)
	case *counts != "":
		err = printCounts(os.Stdout, *counts)
	case *failures != "":
		err = printFailures(os.Stdout, *failures, *lines)
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		os.Exit(1)
	}
}

// copyStream writes every line of in to the file jsonPath and the output the
// line carries to out. A line that is not JSON (the go command's own errors,
// a build failure) is copied to out as it is, so that nothing is hidden.
func copyStream(in io.Reader, out io.Writer, jsonPath string) error {
	f, err := os.Create(jsonPath)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if _, err := f.Write(append(line, '\n')); err != nil {
			return err
		}
		var e event
		if json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(out, "%s\n", line)
			continue
		}
		if e.Action == "output" {
			if _, err := io.WriteString(out, e.Output); err != nil {
				return err
			}
		}
	}
	return sc.Err()
}

type timing struct {
	pkg, test, result string
	elapsed           float64
}

func printReport(out io.Writer, path string, top int, areas string) error {
	tests, pkgs, err := readTimings(path, areas)
	if err != nil {
		return err
	}
	var first, last time.Time
	if err := eachEvent(path, func(e event) {
		if e.Time.IsZero() {
			return
		}
		if first.IsZero() || e.Time.Before(first) {
			first = e.Time
		}
		if e.Time.After(last) {
			last = e.Time
		}
	}); err != nil {
		return err
	}
	sort.SliceStable(tests, func(i, j int) bool { return tests[i].elapsed > tests[j].elapsed })
	sort.SliceStable(pkgs, func(i, j int) bool { return pkgs[i].elapsed > pkgs[j].elapsed })

	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(out, "--- the %d slowest tests\n", min(top, len(tests)))
	for _, t := range tests[:min(top, len(tests))] {
		fmt.Fprintf(w, "%7.1f s\t%s\t%s\t%s\n", t.elapsed, t.result, short(t.pkg), t.test)
	}
	w.Flush()
	fmt.Fprintln(out, "--- time per package")
	var sum float64
	for _, p := range pkgs {
		fmt.Fprintf(w, "%7.1f s\t%s\t%s\n", p.elapsed, p.result, short(p.pkg))
		sum += p.elapsed
	}
	fmt.Fprintf(w, "%7.1f s\t\tthe packages' times added up (%d packages)\n", sum, len(pkgs))
	fmt.Fprintf(w, "%7.1f s\t\tfrom the first test event to the last\n", last.Sub(first).Seconds())
	return w.Flush()
}

// printCounts prints how many tests (subtests included) passed, failed and
// were skipped, on one line a CI reads as the run's verdict. A package that
// failed without a failed test (it did not build, or its TestMain failed)
// counts as one failure.
func printCounts(out io.Writer, path string) error {
	var passed, failed, skipped int
	failedTests := map[string]int{}
	var failedPkgs []string
	err := eachEvent(path, func(e event) {
		switch {
		case e.Test == "" && e.Action == "fail":
			failedPkgs = append(failedPkgs, e.Package)
		case e.Test == "":
		case e.Action == "pass":
			passed++
		case e.Action == "fail":
			failed++
			failedTests[e.Package]++
		case e.Action == "skip":
			skipped++
		}
	})
	for _, p := range failedPkgs {
		if failedTests[p] == 0 {
			failed++
		}
	}
	fmt.Fprintf(out, "tests: %d passed, %d failed, %d skipped\n", passed, failed, skipped)
	return err
}

// printFailures prints, for every failed test none of whose subtests failed,
// the last of its own messages. Tests run side by side interleave their
// lines in the stream; here each failure's message stands next to its name,
// at the end of the run where a reader of a long log looks first.
func printFailures(out io.Writer, path string, lines int) error {
	type key struct{ pkg, test string }
	output := map[key][]string{}
	var failed []key
	err := eachEvent(path, func(e event) {
		k := key{e.Package, e.Test}
		switch {
		case e.Test == "":
		case e.Action == "output":
			output[k] = append(output[k], e.Output)
		case e.Action == "fail":
			failed = append(failed, k)
		}
	})
	if err != nil || len(failed) == 0 {
		return err
	}
	fmt.Fprintln(out, "--- what the failed tests printed last")
	for _, k := range failed {
		if slices.ContainsFunc(failed, func(o key) bool { return o.pkg == k.pkg && strings.HasPrefix(o.test, k.test+"/") }) {
			continue // its failed subtest says why
		}
		fmt.Fprintf(out, "%s %s:\n", short(k.pkg), k.test)
		// The test's own messages (t.Log, t.Error: indented four
		// spaces), not what they quote below them (an agent's log
		// lines, indented further), which would push the failure out.
		var own []string
		for _, l := range output[k] {
			if strings.HasPrefix(l, "    ") && !strings.HasPrefix(l, "     ") || strings.HasPrefix(l, "--- ") {
				own = append(own, l)
			}
		}
		for _, l := range own[max(0, len(own)-lines):] {
			fmt.Fprint(out, l)
		}
	}
	return nil
}

// eachEvent calls f with every event of the JSON file at path.
func eachEvent(path string, f func(event)) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			f(e)
		}
	}
	return sc.Err()
}

// readTimings returns the tests' and the packages' results with their
// elapsed times: the top-level tests, but in the package areas, whose
// top-level tests group its tests by area, their subtests. Packages without
// test files say so and are left out; a package that ran in both of make
// test's phases is one row, its times added, failed if either run failed.
func readTimings(path, areas string) (tests, pkgs []timing, err error) {
	pkgRow := map[string]int{}
	err = eachEvent(path, func(e event) {
		if e.Action != "pass" && e.Action != "fail" && e.Action != "skip" {
			return
		}
		t := timing{pkg: e.Package, test: e.Test, result: e.Action, elapsed: e.Elapsed}
		switch {
		case e.Test == "" && e.Action == "skip":
			// [no test files]
		case e.Test == "":
			i, seen := pkgRow[e.Package]
			if !seen {
				pkgRow[e.Package] = len(pkgs)
				pkgs = append(pkgs, t)
				return
			}
			pkgs[i].elapsed += t.elapsed
			if t.result == "fail" {
				pkgs[i].result = "fail"
			}
		case short(e.Package) == areas:
			if strings.Count(e.Test, "/") == 1 {
				tests = append(tests, t)
			}
		case !strings.Contains(e.Test, "/"):
			tests = append(tests, t)
		}
	})
	return tests, pkgs, err
}

// short drops the module path, which every package shares.
func short(pkg string) string {
	const module = "github.com/mptcp-operator/mptcp-operator/"
	if rest, ok := strings.CutPrefix(pkg, module); ok {
		return "./" + rest
	}
	return pkg
}
