# Cilium (cilium-agent and its CNI plugin cilium-cni) for the test bed's real
# nodes: built from hack/cilium, a module of its own as hack/calico is (see
# hack/cilium/README.md). Both are pure Go (CGO_ENABLED=0). Beside them:
# Cilium's CRDs and the sources of its BPF datapath (bpf/), from the same
# module: the agent compiles them at run time with clang >= 18 (Debian's
# clang-19, hack/install-deps.sh).

# Must agree with hack/cilium/go.mod (the recipe checks).
CILIUM_VERSION := v1.20.2
CILIUM_KEY := $(shell cat hack/cilium/go.sum 2>/dev/null | sha256sum | cut -c1-8)
CILIUM_DIR := $(CACHE_DIR)/tools/cilium-$(CILIUM_VERSION)-$(CILIUM_KEY)

##@ Cilium

$(CILIUM_DIR)/cilium-agent $(CILIUM_DIR)/cilium-cni: | deps
	@mkdir -p $(CILIUM_DIR)
	@v=$$(cd hack/cilium && $(GO) list -m -f '{{.Version}}' github.com/cilium/cilium); \
		[[ $$v == $(CILIUM_VERSION) ]] || { echo "hack/cilium/go.mod pins cilium $$v, not $(CILIUM_VERSION)" >&2; exit 1; }
	cd hack/cilium && CGO_ENABLED=0 nice -n 19 $(GO) build -trimpath -ldflags '-s -w' \
		-o $(CILIUM_DIR)/cilium-agent.tmp github.com/cilium/cilium/daemon
	cd hack/cilium && CGO_ENABLED=0 nice -n 19 $(GO) build -trimpath -ldflags '-s -w' \
		-o $(CILIUM_DIR)/cilium-cni.tmp github.com/cilium/cilium/plugins/cilium-cni
	mv $(CILIUM_DIR)/cilium-agent.tmp $(CILIUM_DIR)/cilium-agent
	mv $(CILIUM_DIR)/cilium-cni.tmp $(CILIUM_DIR)/cilium-cni

# The module cache is read-only; the copies are writable so that the cache
# directory can be removed.
$(CILIUM_DIR)/bpf/bpf_lxc.c: | deps
	@mkdir -p $(CILIUM_DIR)
	m=$$(cd hack/cilium && $(GO) list -m -f '{{.Dir}}' github.com/cilium/cilium) && \
		rm -rf $(CILIUM_DIR)/crds $(CILIUM_DIR)/bpf.tmp && mkdir -p $(CILIUM_DIR)/crds && \
		cp $$m/pkg/k8s/apis/cilium.io/client/crds/v2/*.yaml $$m/pkg/k8s/apis/cilium.io/client/crds/v2alpha1/*.yaml \
			$(CILIUM_DIR)/crds/ && \
		cp -r $$m/bpf $(CILIUM_DIR)/bpf.tmp && chmod -R u+w $(CILIUM_DIR)/crds $(CILIUM_DIR)/bpf.tmp && \
		rm -rf $(CILIUM_DIR)/bpf && mv $(CILIUM_DIR)/bpf.tmp $(CILIUM_DIR)/bpf

.PHONY: cilium
cilium: $(CILIUM_DIR)/cilium-agent $(CILIUM_DIR)/cilium-cni $(CILIUM_DIR)/bpf/bpf_lxc.c ## Build cilium-agent and Cilium's CNI plugin (hack/cilium), with Cilium's CRDs and BPF sources, into the cache.

test: cilium
test: export CILIUM := $(CILIUM_DIR)

.PHONY: print-cilium
print-cilium: ## Print the directory holding the Cilium binaries, for CILIUM= when running by hand.
	@echo $(CILIUM_DIR)
