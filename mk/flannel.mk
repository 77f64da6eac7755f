# flannel on the test bed's real nodes (TestCNI/flannel-*, TestFlannel). flanneld is
# built at a pinned version from hack/flannel, a module of its own as
# hack/tools is, as flannel's own Makefile builds it on amd64: with cgo (its
# udp backend is C there), linked statically, stamped with its version. `go install github.com/flannel-io/flannel@$(FLANNEL_VERSION)`
# cannot work here: flanneld imports its tencent-vpc backend unconditionally,
# and the Go module proxy does not serve the Tencent Cloud VPC SDK it needs
# (403); hack/flannel replaces that SDK with a stub whose calls fail.
#
# The flannel CNI plugin (github.com/flannel-io/cni-plugin) is not served by
# the Go module proxy either (403 for its version list and for every version
# asked), so it is not built. It only reads flanneld's
# /run/flannel/subnet.env and delegates to `bridge` + `host-local`; the bed
# writes that delegate configuration itself from subnet.env
# (test/testbed/nodes/flannel.go), for the distribution's bridge plugin.

# Must agree with hack/flannel/go.mod (the recipe checks).
FLANNEL_VERSION := v0.28.10
FLANNEL_KEY := $(shell cat hack/flannel/go.sum hack/flannel/tencentvpc-stub/v20170312/*.go 2>/dev/null | sha256sum | cut -c1-8)
FLANNELD := $(CACHE_DIR)/tools/flanneld-$(FLANNEL_VERSION)-$(FLANNEL_KEY)

##@ Flannel (the test bed's CNI for TestCNI)

$(FLANNELD): | deps
	@mkdir -p $(dir $@)
	@v=$$(cd hack/flannel && $(GO) list -m -f '{{.Version}}' github.com/flannel-io/flannel); \
		[[ $$v == $(FLANNEL_VERSION) ]] || { echo "hack/flannel/go.mod pins flannel $$v, not $(FLANNEL_VERSION)" >&2; exit 1; }
	cd hack/flannel && CGO_ENABLED=1 $(GO) build -trimpath -o $@.tmp \
		-ldflags '-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$(FLANNEL_VERSION) -extldflags "-static"' \
		github.com/flannel-io/flannel
	mv $@.tmp $@

.PHONY: flanneld
flanneld: $(FLANNELD) ## Build flanneld $(FLANNEL_VERSION) (hack/flannel) into the cache, for TestCNI (test/e2e) and TestFlannel (test/testbed/nodes).

.PHONY: print-flanneld
print-flanneld: ## Print the flanneld binary's path, for FLANNELD= when running TestCNI or TestFlannel by hand.
	@echo $(FLANNELD)

test: $(FLANNELD)
test: export FLANNELD := $(FLANNELD)
