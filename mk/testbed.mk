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

# The node kernels of the compatibility matrix (docs/install.md): Debian cloud
# kernels fetched as the guests' is, each booted in a guest that runs what the
# agent asks of a node's kernel (test/kernels). Not in `make test`: .ci/run
# runs `make test-kernels` after it.
KERNEL_MATRIX := linux-image-6.12.117+deb12-cloud-amd64=6.12.117-1~deb12u1 $(GUEST_KERNEL_PACKAGE)=$(GUEST_KERNEL_VERSION)
KERNEL_ASSETS := $(foreach k,$(KERNEL_MATRIX),$(CACHE_DIR)/guest/$(subst =,_,$(k))-$(GUEST_ASSETS_KEY))

.PHONY: kernel-assets
kernel-assets: ## Fetch the matrix's node kernels into the cache (once each).
	@for k in $(KERNEL_MATRIX); do \
		hack/guest-assets.sh "$${k%%=*}" "$${k#*=}" "$(CACHE_DIR)/guest/$${k%%=*}_$${k#*=}-$(GUEST_ASSETS_KEY)" || exit 1; done

.PHONY: test-kernels
test-kernels: deps kernel-assets ## Boot each kernel of the matrix in a QEMU guest and check the datapath there (verifier, TCX links, socket program).
	MPTCP_KERNEL_ASSETS="$(KERNEL_ASSETS)" $(GO) test -count=1 -v -timeout 20m -run '^TestKernels$$' ./test/kernels/

.PHONY: print-guest-assets
print-guest-assets: ## Print the directory to export as MPTCP_GUEST_ASSETS.
	@echo $(GUEST_ASSETS)
