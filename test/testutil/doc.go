// Package testutil is the one home of the helpers tests share, a file each:
//
//   - privileged.go: prerequisites (root, BPF, tools); under CI (CI=true) a
//     missing one fails the test loudly, elsewhere the test is skipped with
//     the reason printed.
//   - tools.go: tools the Makefile builds (BuiltTool) and C test programs
//     (CompileC).
//   - netns.go: network namespaces that go when the test ends.
//   - run.go: a command that must succeed.
//   - eventually.go: a condition polled until it holds or time is up.
//   - freeport.go: a free TCP port on the loopback.
//   - median.go: min and median of a benchmark's runs.
//   - yamldocs.go: the documents of a multi-document YAML stream.
//
// It imports the standard library and small packages only (netns,
// apimachinery's YAML reader), so that any unit test may use it; helpers
// that need heavier packages live in subpackages (bpfutil: cilium/ebpf).
package testutil
