package main

import (
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// uriBase is where a release publishes its files: the GitHub release named
// after the chart's version (KREW_URI_BASE overrides it). krew checks each
// archive's sha256 wherever it comes from.
func uriBase(chart chartMeta) string {
	if b := os.Getenv("KREW_URI_BASE"); b != "" {
		return b
	}
	return "https://github.com/mptcp-operator/mptcp-operator/releases/download/v" + chart.Version
}

const krewDescription = `kubectl mptcp status shows the operator's paths per node, node states,
agents missing and policies; kubectl mptcp explain POD walks what decides
a pod's subflows and names each step that limits them; kubectl mptcp
subflows POD lists a pod's live connections and subflows. It works through
the API server only (the agent's data through pods/exec in the agent's pod).
`

// writeKrewManifest writes mptcp.yaml, the krew plugin manifest naming every
// archive by platform and sha256, so that
//
//	kubectl krew install --manifest=mptcp.yaml [--archive=kubectl-mptcp_<os>_<arch>.tar.gz]
//
// installs `kubectl mptcp`.
func writeKrewManifest(out string, chart chartMeta, plugins []plugin) error {
	type file struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	type platformSpec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		URI    string `json:"uri"`
		SHA256 string `json:"sha256"`
		Bin    string `json:"bin"`
		Files  []file `json:"files"`
	}
	var platforms []platformSpec
	for _, p := range plugins {
		s := platformSpec{URI: uriBase(chart) + "/" + p.archive, SHA256: p.sha256, Bin: "kubectl-mptcp",
			Files: []file{{"kubectl-mptcp", "."}, {"LICENSE", "."}}}
		s.Selector.MatchLabels = map[string]string{"os": p.goos, "arch": p.goarch}
		platforms = append(platforms, s)
	}
	manifest := map[string]any{
		"apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
		"kind":       "Plugin",
		"metadata":   map[string]string{"name": "mptcp"},
		"spec": map[string]any{
			"version":          "v" + chart.AppVersion,
			"homepage":         "https://github.com/mptcp-operator/mptcp-operator",
			"shortDescription": "Explain the MPTCP subflows of pods under mptcp-operator",
			"description":      krewDescription,
			"platforms":        platforms,
		},
	}
	b, err := yaml.Marshal(manifest)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "mptcp.yaml"), b, 0o644)
}
