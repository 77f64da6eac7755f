# A release: everything it publishes in _output/release/ (docs/install.md#release),
# written by hack/tools/release with the image builder, helm and cyclonedx-gomod
# (pinned in hack/tools/go.mod). The same tree gives the same bytes.

CYCLONEDX_GOMOD_VERSION := v1.10.0
CYCLONEDX_GOMOD := $(CACHE_DIR)/tools/cyclonedx-gomod-$(CYCLONEDX_GOMOD_VERSION)
RELEASE_TOOL_KEY := $(shell cat hack/tools/release/*.go hack/tools/go.sum 2>/dev/null | sha256sum | cut -c1-12)
RELEASE_TOOL := $(CACHE_DIR)/tools/release-$(RELEASE_TOOL_KEY)
RELEASE_DIR ?= $(CURDIR)/_output/release
CHART_VERSION = $(shell sed -n 's/^version: *"*\([^"]*\)"*$$/\1/p' charts/mptcp-operator/Chart.yaml)

##@ Release

$(CYCLONEDX_GOMOD):
	@mkdir -p $(dir $@)
	@pinned=$$(cd hack/tools && $(GO) list -m -f '{{.Version}}' github.com/CycloneDX/cyclonedx-gomod); \
		[ "$$pinned" = "$(CYCLONEDX_GOMOD_VERSION)" ] || { echo "hack/tools/go.mod pins cyclonedx-gomod $$pinned, mk/release.mk says $(CYCLONEDX_GOMOD_VERSION)" >&2; exit 1; }
	cd hack/tools && $(GO) build -o $@.tmp github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod && mv $@.tmp $@

$(RELEASE_TOOL):
	@mkdir -p $(dir $@)
	cd hack/tools && $(GO) build -o $@.tmp ./release && mv $@.tmp $@

.PHONY: release
release: $(RELEASE_TOOL) $(IMAGEBUILD) $(HELM) $(CYCLONEDX_GOMOD) ## make release VERSION=<chart version>: chart, amd64+arm64 image indexes, plugin archives and krew manifest, SBOMs, SHA256SUMS into _output/release/.
	@[ -n "$(VERSION)" ] || { echo "make release needs VERSION=<the chart's version>, now $(CHART_VERSION) (charts/mptcp-operator/Chart.yaml)" >&2; exit 2; }
	$(RELEASE_TOOL) -repo $(CURDIR) -out $(RELEASE_DIR) -version $(VERSION) \
		-imagebuild $(IMAGEBUILD) -helm $(HELM) -cyclonedx $(CYCLONEDX_GOMOD)

.PHONY: test-release
test-release: $(RELEASE_TOOL) $(IMAGEBUILD) $(HELM) $(CYCLONEDX_GOMOD) ## Build the release twice: same bytes; platforms, executables, krew sha256s, SBOMs and SHA256SUMS checked (not in make test: minutes).
	RELEASE_TOOL=$(RELEASE_TOOL) IMAGEBUILD=$(IMAGEBUILD) HELM=$(HELM) CYCLONEDX_GOMOD=$(CYCLONEDX_GOMOD) \
		$(GO) test -count=1 -timeout 30m ./hack/release/

.PHONY: kubectl-mptcp
kubectl-mptcp: $(RELEASE_TOOL) $(IMAGEBUILD) ## Build the kubectl mptcp plugin into bin/, and its krew archive and manifest into _output/krew/ (docs/troubleshooting.md).
	$(RELEASE_TOOL) -krew -repo $(CURDIR) -bin $(BIN) -out _output/krew -imagebuild $(IMAGEBUILD)
