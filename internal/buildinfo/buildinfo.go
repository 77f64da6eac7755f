// Package buildinfo says which build a binary is: the version (the chart's
// appVersion, which tags the images) and the source revision that the
// image builder (hack/tools/imagebuild) stamps into it with -ldflags -X.
// A binary built otherwise (go build, go test) is version "dev" of an
// unknown revision.
package buildinfo

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// Stamped by the image builder; see the package comment.
var (
	version  = "dev"
	revision = "unknown"
)

// Version is the binary's version: the chart's appVersion it was built for.
func Version() string { return version }

// Revision is the commit the binary was built from, with "-dirty-" and a
// hash of the changed files when the tree had changes.
func Revision() string { return revision }

// String is the build in one line, for a -version flag.
func String() string {
	return version + " " + revision + " " + runtime.Version()
}

// Collector is the gauge <namespace>_build_info: 1, with the build in its
// labels (version, revision, goversion), as Prometheus's exporters name
// theirs, so that a query can join any series with the build that made it.
func Collector(namespace string) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace,
		Name:      "build_info",
		Help:      "1, labelled with the build: version (the chart's appVersion the image was built for), source revision and Go version.",
		ConstLabels: prometheus.Labels{
			"version":   version,
			"revision":  revision,
			"goversion": runtime.Version(),
		},
	}, func() float64 { return 1 })
}
