##@ Test bed

.PHONY: traffic
traffic: ## Build the test bed's traffic tool (hack/traffic) into bin/.
	$(GO) build -o $(BIN)/traffic ./hack/traffic

.PHONY: test-testbed
test-testbed: ## Run the test bed's own tests (root; skipped with a reason otherwise, fatal when CI=true).
	$(GO) test -count=1 -v ./test/testbed/

.PHONY: testbed-sweep
testbed-sweep: ## Remove test beds left behind by crashed runs (beds of live processes are kept).
	$(GO) run ./test/testbed/cmd/sweep
