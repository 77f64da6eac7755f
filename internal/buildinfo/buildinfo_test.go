package buildinfo

import (
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The gauge is 1 with the build in its labels; an unstamped binary says
// it is a development build.
func TestBuildInfoGaugeCarriesTheBuild(t *testing.T) {
	want := `# HELP mptcp_agent_build_info 1, labelled with the build: version (the chart's appVersion the image was built for), source revision and Go version.
# TYPE mptcp_agent_build_info gauge
mptcp_agent_build_info{goversion="` + runtime.Version() + `",revision="unknown",version="dev"} 1
`
	if err := testutil.CollectAndCompare(Collector("mptcp_agent"), strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if got := String(); got != "dev unknown "+runtime.Version() {
		t.Fatalf("String() = %q", got)
	}
}
