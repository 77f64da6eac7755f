# Calico (felix on iptables-nft, and its CNI plugin) for the test bed's real
# nodes: built from hack/calico, a module of its own as hack/flannel is (see
# hack/calico/README.md). The binaries use cgo (felix links libpcap), so the
# build needs Debian's libpcap-dev and runs need ipset, iptables and
# libpcap0.8 (hack/install-deps.sh). Beside them: Calico's CRDs and its
# manifest (for its ClusterRoles) from the same module, which the bed applies.

# Must agree with hack/calico/go.mod (the recipe checks).
CALICO_VERSION := v1.11.0-cni-plugin.0.20250813170300-a0db560f0520
CALICO_KEY := $(shell cat hack/calico/go.sum 2>/dev/null | sha256sum | cut -c1-8)
CALICO_DIR := $(CACHE_DIR)/tools/calico-$(CALICO_VERSION)-$(CALICO_KEY)

##@ Calico

$(CALICO_DIR)/calico-node $(CALICO_DIR)/calico: | deps
	@mkdir -p $(CALICO_DIR)
	@v=$$(cd hack/calico && $(GO) list -m -f '{{.Version}}' github.com/projectcalico/calico); \
		[[ $$v == $(CALICO_VERSION) ]] || { echo "hack/calico/go.mod pins calico $$v, not $(CALICO_VERSION)" >&2; exit 1; }
	cd hack/calico && CGO_ENABLED=1 nice -n 19 $(GO) build -trimpath -ldflags '-s -w' \
		-o $(CALICO_DIR)/calico-node.tmp github.com/projectcalico/calico/node/cmd/calico-node
	cd hack/calico && CGO_ENABLED=1 nice -n 19 $(GO) build -trimpath -ldflags '-s -w' \
		-o $(CALICO_DIR)/calico.tmp github.com/projectcalico/calico/cni-plugin/cmd/calico
	mv $(CALICO_DIR)/calico-node.tmp $(CALICO_DIR)/calico-node
	mv $(CALICO_DIR)/calico.tmp $(CALICO_DIR)/calico

$(CALICO_DIR)/calico.yaml: | deps
	@mkdir -p $(CALICO_DIR)
	m=$$(cd hack/calico && $(GO) list -m -f '{{.Dir}}' github.com/projectcalico/calico) && \
		rm -rf $(CALICO_DIR)/crds && mkdir $(CALICO_DIR)/crds && \
		cp $$m/libcalico-go/config/crd/*.yaml $(CALICO_DIR)/crds/ && \
		cp $$m/manifests/calico.yaml $@.tmp && mv $@.tmp $@

.PHONY: calico
calico: $(CALICO_DIR)/calico-node $(CALICO_DIR)/calico $(CALICO_DIR)/calico.yaml ## Build calico-node and Calico's CNI plugin (hack/calico), with Calico's CRDs and manifest, into the cache, for TestCNI's Calico row.

test: calico
test: export CALICO := $(CALICO_DIR)

.PHONY: print-calico
print-calico: ## Print the directory holding the Calico binaries, for CALICO= when running by hand.
	@echo $(CALICO_DIR)
