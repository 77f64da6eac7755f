# API, controller and their test control plane.
# kube-apiserver is built from k8s.io/kubernetes at KUBE_VERSION in the separate
# tools module hack/tools (which must pin the same version), cached outside the
# clone; etcd comes from the distribution (apt-get install etcd-server).

KUBE_VERSION ?= v1.36.3
ENVTEST_ASSETS := $(CACHE_DIR)/envtest/$(KUBE_VERSION)
# Must match hack/tools/go.mod (checked when building it).
CONTROLLER_GEN_VERSION := v0.21.0
CONTROLLER_GEN := $(CACHE_DIR)/tools/controller-gen-$(CONTROLLER_GEN_VERSION)
API_TEST_PKGS := ./api/... ./internal/controller/... ./cmd/controller/... ./bench/controller/...

##@ API and controller

$(CONTROLLER_GEN):
	@mkdir -p $(dir $@)
	@pinned=$$(cd hack/tools && $(GO) list -m -f '{{.Version}}' sigs.k8s.io/controller-tools); \
		[ "$$pinned" = "$(CONTROLLER_GEN_VERSION)" ] || { echo "hack/tools/go.mod pins controller-tools $$pinned, mk/api.mk says $(CONTROLLER_GEN_VERSION)" >&2; exit 1; }
	cd hack/tools && $(GO) build -o $@.tmp sigs.k8s.io/controller-tools/cmd/controller-gen && mv $@.tmp $@

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Build controller-gen (pinned in hack/tools/go.mod) into the cache.

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate DeepCopy methods of api/.
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate CRDs and RBAC into config/, then the chart's copies (mk/chart.mk).
	$(CONTROLLER_GEN) crd rbac:roleName=controller webhook \
		paths=./api/... paths=./internal/controller/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	@$(MAKE) --no-print-directory chart-manifests

.PHONY: envtest-assets
envtest-assets: $(ENVTEST_ASSETS)/kube-apiserver $(ENVTEST_ASSETS)/etcd ## Build kube-apiserver $(KUBE_VERSION) and link etcd into the cache (once).

$(ENVTEST_ASSETS)/kube-apiserver $(ENVTEST_ASSETS)/etcd &:
	hack/envtest-assets.sh $(KUBE_VERSION) $(ENVTEST_ASSETS)

.PHONY: test-api
test-api: envtest-assets ## Test the API (real API server), the compiler and the controller.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) $(GO) test -count=1 $(API_TEST_PKGS)

.PHONY: bench-controller
bench-controller: envtest-assets ## Converge 50 nodes x 20 pods x 10 policies; rewrite the "Controller convergence" section of docs/benchmarks.md.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) KUBE_VERSION=$(KUBE_VERSION) BENCH_REPORT=$(CURDIR)/docs/benchmarks.md \
		$(GO) test -count=1 -run '^$$' -bench BenchmarkConvergence -benchtime=1x -timeout 20m ./bench/controller/

.PHONY: bench-scale
bench-scale: envtest-assets ## Converge 100 and 1000 simulated nodes of 20 pods (BENCH_SCALE=100,1000,5000 for more), one new address, one policy change; rewrite the "Scale" section of docs/benchmarks.md.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) KUBE_VERSION=$(KUBE_VERSION) BENCH_REPORT=$(CURDIR)/docs/benchmarks.md \
		$(GO) test -count=1 -run '^$$' -bench BenchmarkScale -benchtime=1x -timeout 90m ./bench/controller/

.PHONY: print-envtest-assets
print-envtest-assets: ## Print the directory to export as KUBEBUILDER_ASSETS.
	@echo $(ENVTEST_ASSETS)
