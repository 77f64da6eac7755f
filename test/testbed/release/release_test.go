package release

import (
	"slices"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
)

// The images' references become the chart's repository and tag values,
// a registry with a port included, with pullPolicy Never: the images are
// on the nodes, nothing may be pulled.
func TestImageValuesNameTheImportedImages(t *testing.T) {
	got, err := ImageValues(nodes.Images{
		AgentImage:      {Ref: "registry.example:5000/mptcp/agent:release-88bc912"},
		ControllerImage: {Ref: "ghcr.io/mptcp-operator/controller:0.1.0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"agent.image.repository=registry.example:5000/mptcp/agent", "agent.image.tag=release-88bc912", "agent.image.pullPolicy=Never",
		"controller.image.repository=ghcr.io/mptcp-operator/controller", "controller.image.tag=0.1.0", "controller.image.pullPolicy=Never",
	} {
		i := slices.Index(got, want)
		if i < 1 || got[i-1] != "--set" {
			t.Errorf("values %q lack --set %s", got, want)
		}
	}
	if _, err := ImageValues(nodes.Images{AgentImage: {Ref: "registry.example:5000/agent"}, ControllerImage: {Ref: "c:1"}}); err == nil {
		t.Error("a reference without a tag was accepted")
	}
	if _, err := ImageValues(nodes.Images{AgentImage: {Ref: "a:1"}}); err == nil {
		t.Error("no controller image, no error")
	}
}
