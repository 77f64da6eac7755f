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

# The VM guests' kernel: a Debian cloud kernel, fetched with apt-get download
# and unpacked (never installed), older than the node's as a tenant's would
# be. The guests' initramfs is built by the tests from this tree.
GUEST_KERNEL_PACKAGE := linux-image-6.1.0-56-cloud-amd64
GUEST_KERNEL_VERSION := 6.1.192-2
GUEST_ASSETS_KEY := $(shell sha256sum hack/guest-assets.sh | cut -c1-8)
GUEST_ASSETS := $(CACHE_DIR)/guest/$(GUEST_KERNEL_PACKAGE)_$(GUEST_KERNEL_VERSION)-$(GUEST_ASSETS_KEY)

.PHONY: guest-assets
guest-assets: $(GUEST_ASSETS)/vmlinuz ## Fetch the VM guests' kernel and its network driver's modules into the cache (once).

$(GUEST_ASSETS)/vmlinuz:
	hack/guest-assets.sh $(GUEST_KERNEL_PACKAGE) $(GUEST_KERNEL_VERSION) $(GUEST_ASSETS)

.PHONY: print-guest-assets
print-guest-assets: ## Print the directory to export as MPTCP_GUEST_ASSETS.
	@echo $(GUEST_ASSETS)
