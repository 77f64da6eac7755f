# Build, datapath generation, lint, tests, demo and benchmarks.

GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(CACHE_DIR)/tools/golangci-lint-$(GOLANGCI_LINT_VERSION)
CLANG_FORMAT ?= clang-format
BPF_SOURCES := $(wildcard bpf/*.c bpf/include/*.h bpf/test/*.c bench/*/*.c)
# The C of the preload library (and its test programs), in the same style.
PRELOAD_SOURCES := $(wildcard preload/lib/*.c preload/testdata/*.c bench/preload/testdata/*.c hack/libc-client/*.c)
# Tests that build real networks, load BPF and run a real API server: the
# whole suite runs as root; see docs/testing.md.
TEST_TIMEOUT ?= 80m

##@ Build

.PHONY: deps
deps: ## Install the pinned Debian packages the build, tests and demo need (when missing).
	hack/install-deps.sh

.PHONY: build
build: ## Build the agent, the traffic tool and the demo into bin/.
	$(GO) build -o $(BIN)/agent ./cmd/agent
	$(GO) build -o $(BIN)/traffic ./hack/traffic
	$(GO) build -o $(BIN)/demo ./test/demo

.PHONY: generate-bpf
generate-bpf: ## Regenerate the BPF objects and Go bindings (bpf2go; needs clang).
	$(GO) generate ./internal/datapath/... ./internal/socketmptcp/... ./bench/xdpdrop/... ./test/testbed/ ./test/testutil/bpfutil/

.PHONY: generate-preload
generate-preload: ## Rebuild the preload library (preload/libmptcp-socket.so, committed; needs clang).
	$(GO) generate ./preload/...

# `make generate` (mk/api.mk) also regenerates the datapath and the preload library.
generate: generate-bpf generate-preload

.PHONY: verify
verify: generate manifests ## Fail if anything generated is stale (CI runs this).
	@git diff --exit-code || { echo "generated files are stale: run 'make generate manifests' and commit" >&2; exit 1; }

##@ Quality

$(GOLANGCI_LINT):
	@mkdir -p $(dir $@)
	GOBIN=$(dir $@) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(dir $@)/golangci-lint $@

.PHONY: lint
lint: $(GOLANGCI_LINT) ## gofmt, go vet, golangci-lint (product and tools module), clang-format on the C code (BPF, preload library), helm lint of the chart.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GOLANGCI_LINT) run ./...
# The tools module's own programs (imagebuild, valuesdoc); ./... there holds
# none of the pinned tools' packages.
	cd hack/tools && $(GO) vet ./... && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...
	$(CLANG_FORMAT) --dry-run --Werror $(BPF_SOURCES) $(PRELOAD_SOURCES)

##@ Test

# Where tests keep the evidence of failed transfers (go test -artifacts)
# and record the stalls they tried again; hack/test-summary.sh reports both.
# The run's `go test -json` is kept there too (test.json): hack/testtimes
# prints the tests' output from it as they run, then the slowest tests and
# the time of each package.
TEST_OUTPUT := $(CURDIR)/_output/test
BENCH_OUTPUT := $(CURDIR)/_output/bench
# Two phases. First every test that measures nothing, several packages at a
# time (TEST_PACKAGES_AT_ONCE; within a package, functional e2e areas run
# TEST_PARALLEL tests side by side). Then, one at a time with the machine
# to themselves, the areas TEST_ALONE_NAMES of any package: they measure
# rates and stalls (TestRate, TestFailover), load both cores on purpose
# (TestIntegrity), or run the chart's agents at its default 30 ms liveness
# probes (TestChart, two clusters side by side), which other packages' load
# starves into false path-downs, or change what every bed shares (TestMachineWide: the machine's list of
# allowed congestion controls, which beds hold widened while they run).
# The charts package's checks (no nodes) are TestHelmChart, outside that set.
# The first phase starts the longest packages first (TEST_FIRST after the
# e2e package, the longest): go test starts packages in the order it is
# given them, and a long package started last would run alone at the end.
# This tree's images are built once for the run (MPTCP_TEST_IMAGES) rather than
# by every package that imports them into real nodes.
TEST_ALONE_NAMES := TestRate|TestFailover|TestIntegrity|TestChart|TestMachineWide
TEST_ALONE := ^($(TEST_ALONE_NAMES))$$
TEST_PACKAGES_AT_ONCE ?= 3
TEST_FIRST := ./internal/datapath ./internal/controller ./test/testbed ./test/testbed/nodes ./internal/agent/liveness \
	./bench/controller ./internal/controller/podwebhook
TEST_PARALLEL ?= 2
# Packages a target of their own runs, not make test: the release, built
# twice for two architectures and four plugin platforms, takes minutes
# (make test-release); the kernel matrix, each kernel in a guest, and the
# images built twice and compared (make test-kernels and make test-images,
# which .ci/run runs after make test; make test builds the images once).
TEST_ELSEWHERE := ./hack/release ./test/kernels ./hack/images

.PHONY: test
test: deps envtest-assets node-assets guest-assets ## Run every test (needs root: network namespaces, BPF, a real API server); then the slowest tests, time per package, retries and kept evidence.
	@rm -rf $(TEST_OUTPUT) && mkdir -p $(TEST_OUTPUT)
	$(GO) build -o $(BIN)/testtimes ./hack/testtimes
	SOURCE_DATE_EPOCH= $(IMAGEBUILD) -repo $(CURDIR) -out $(TEST_OUTPUT)/images >/dev/null
	all=$$($(GO) list ./... | grep -vxF "$$($(GO) list $(TEST_ELSEWHERE))"); e2e=$$($(GO) list ./test/e2e); first=$$($(GO) list $(TEST_FIRST)); \
	rest=$$(echo "$$all" | grep -vxF "$$(printf '%s\n' $$e2e $$first)"); \
	alone=$$($(GO) list -f '{{.ImportPath}} {{.Dir}}' ./... | while read -r pkg dir; do \
		! grep -qsE 'func ($(TEST_ALONE_NAMES))\(' $$dir/*_test.go || echo $$pkg; done); \
	export MPTCP_RETRY_LOG=$(TEST_OUTPUT)/retries.tsv KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) MPTCP_TEST_IMAGES=$(TEST_OUTPUT)/images MPTCP_GUEST_ASSETS=$(GUEST_ASSETS); \
	flags="-json -count=1 -timeout $(TEST_TIMEOUT) -artifacts -outputdir $(TEST_OUTPUT)"; \
	rc=0; { $(GO) test $$flags -p $(TEST_PACKAGES_AT_ONCE) -parallel $(TEST_PARALLEL) -skip '$(TEST_ALONE)' $$e2e $$first $$rest || echo $$? >$(TEST_OUTPUT)/failed; \
		$(GO) test $$flags -p 1 -run '$(TEST_ALONE)' $$alone || echo $$? >>$(TEST_OUTPUT)/failed; } 2>&1 | \
		$(BIN)/testtimes -stream -json $(TEST_OUTPUT)/test.json || rc=$$?; \
	[ ! -s $(TEST_OUTPUT)/failed ] || rc=1; \
	$(BIN)/testtimes -report $(TEST_OUTPUT)/test.json -areas ./test/e2e; hack/test-summary.sh $(TEST_OUTPUT); \
	$(BIN)/testtimes -failures $(TEST_OUTPUT)/test.json; $(BIN)/testtimes -counts $(TEST_OUTPUT)/test.json; exit $$rc

# The data-integrity reproducer (docs/testing.md, "Data integrity"):
# INTEGRITY_ROUNDS transfers per scenario, each checked byte by byte.
INTEGRITY_ROUNDS ?= 20

.PHONY: repro-integrity
repro-integrity: deps ## Run the data-integrity reproducer in a loop (INTEGRITY_ROUNDS transfers per scenario, whole packets captured; root).
	@mkdir -p $(TEST_OUTPUT)
	$(GO) test -count=1 -timeout 180m -v -run '^TestIntegrity$$/^(StreamsArriveWhole|KernelChangesStreams)$$' -artifacts -outputdir $(TEST_OUTPUT) ./test/e2e/ \
		-integrity.rounds=$(INTEGRITY_ROUNDS) -integrity.payload

##@ Demo and benchmarks

.PHONY: demo
demo: deps envtest-assets node-assets images $(HELM) ## Bring up 2 nodes x 2 NICs, compare single-path TCP, MPTCP and the agent installed with the Helm chart on real kubelets; print the table, write CSV and chart.
	$(GO) run ./test/demo -out $(CURDIR)/_output/demo -assets $(ENVTEST_ASSETS) -images $(IMAGES_DIR) -helm $(HELM)

.PHONY: bench
bench: ## Run the benchmarks and rewrite their sections of docs/benchmarks.md.
	BENCH_REPORT=$(CURDIR)/docs/benchmarks.md $(GO) test -count=5 -run '^$$' -bench . -benchtime=1x -timeout 30m ./bench/datapath/...

.PHONY: bench-failover
bench-failover: deps ## Fail a NIC mid-transfer in every failover case, agent and kernel alone, 5 rounds each (70 min to 2 h, by machine; root); rewrite the "Failover" section of docs/benchmarks.md. The evidence of an agent transfer that missed a target is kept under _output/bench/failover.
	@rm -rf $(BENCH_OUTPUT)/failover && mkdir -p $(BENCH_OUTPUT)/failover
	BENCH_REPORT=$(CURDIR)/docs/benchmarks.md $(GO) test -count=1 -run '^$$' -bench . -benchtime=5x -timeout 150m \
		-artifacts -outputdir $(BENCH_OUTPUT)/failover ./bench/failover/

.PHONY: bench-steady
bench-steady: deps ## One MPTCP connection of 60 s over two equal paths, nothing failing: longest stall and goodput, agent and hand-routed, checksums on and off, BBR and CUBIC, 5 rounds (about 55 min; root); rewrite the "Steady state: longest stall" section of docs/benchmarks.md.
	BENCH_REPORT=$(CURDIR)/docs/benchmarks.md $(GO) test -count=1 -run '^$$' -bench BenchmarkSteadyStateStalls -benchtime=5x -timeout 90m ./bench/transfer/

.PHONY: bench-cpu
bench-cpu: deps ## Unshaped links, where the CPU sets the pace: 1, 4 and 16 connections through single-path TCP, kernel routing, hand-written rules (checksums off and on), the agent and the agent without DSS checksums, goodput and CPU per gigabyte, 5 rounds (about 20 min; root); rewrite the "Unshaped links" section of docs/benchmarks.md.
	BENCH_REPORT=$(CURDIR)/docs/benchmarks.md $(GO) test -count=1 -run '^$$' -bench BenchmarkCPUBound -benchtime=5x -timeout 60m ./bench/transfer/

.PHONY: bench-vm
bench-vm: deps guest-assets ## VM to VM across two nodes (real guests under QEMU): goodput with kernel routing, hand-written host routing and the agent, nic1 idle and loaded, at 50 and 200 Mbit/s, 3 rounds (about 13 min; root); rewrite the "VM to VM" section of docs/benchmarks.md.
	MPTCP_GUEST_ASSETS=$(GUEST_ASSETS) BENCH_REPORT=$(CURDIR)/docs/benchmarks.md $(GO) test -count=1 -run '^$$' -bench BenchmarkVMToVM -benchtime=3x -timeout 90m ./bench/vm/

.PHONY: bench-preload
bench-preload: deps ## The preload library's cost per socket() and per connect over loopback, and a C client's goodput over two paths with it, against the client asking for MPTCP itself and against TCP, 5 rounds (about 3 min; root); rewrite the "Preload library" sections of docs/benchmarks.md.
	BENCH_REPORT=$(CURDIR)/docs/benchmarks.md $(GO) test -count=1 -run '^$$' -bench BenchmarkPreloadCost -benchtime=5x -timeout 10m ./bench/preload/
	BENCH_REPORT=$(CURDIR)/docs/benchmarks.md $(GO) test -count=1 -run '^$$' -bench BenchmarkPreloadGoodput -benchtime=5x -timeout 20m ./bench/transfer/

.PHONY: bench-smallflows
bench-smallflows: deps ## Flow completion time of 16 KB to 1 MB flows and goodput of 64 MB ones over equal and differing paths: plain TCP, joins at once (held and not) and the join threshold, 5 rounds (about 10 min; root); then what watching waiting connections costs; rewrite the "Small flows" sections of docs/benchmarks.md.
	BENCH_REPORT=$(CURDIR)/docs/benchmarks.md $(GO) test -count=1 -run '^$$' -bench BenchmarkSmallFlows -benchtime=5x -timeout 60m ./bench/subflows/
	BENCH_REPORT=$(CURDIR)/docs/benchmarks.md $(GO) test -count=1 -run '^$$' -bench BenchmarkWatchCost -benchtime=200x -timeout 10m ./bench/subflows/

.PHONY: bench-xdpdrop
bench-xdpdrop: ## Measure the CPU per packet of a join SYN flood dropped by XDP, by TC, by the stack, or met by nic_ingress (about 2 min; root); rewrite the "XDP or TC for dropping a flood" section of docs/benchmarks.md.
	BENCH_REPORT=$(CURDIR)/docs/benchmarks.md $(GO) test -count=1 -run '^$$' -bench . -benchtime=1x -timeout 15m ./bench/xdpdrop/

.PHONY: bench-liveness
bench-liveness: ## Measure the CPU of probing 100 and 1,000 peers over 4 paths, busy and idle, and two probers under a flood forged with a peer's address (root); rewrite the "Liveness probes" and "Liveness under a forged flood" sections of docs/benchmarks.md.
	BENCH_REPORT=$(CURDIR)/docs/benchmarks.md $(GO) test -count=1 -run '^$$' -bench . -benchtime=1x -timeout 10m ./bench/liveness/
