# Real nodes in the test bed: kubelet, kube-controller-manager and
# kube-scheduler, built like kube-apiserver from the tools module at
# KUBE_VERSION and cached next to it (the KUBEBUILDER_ASSETS directory);
# containerd, runc and the CNI plugins come from the distribution
# (hack/install-deps.sh).

NODE_BINARIES := kubelet kube-controller-manager kube-scheduler
NODE_ASSETS := $(addprefix $(ENVTEST_ASSETS)/,$(NODE_BINARIES))

##@ Test bed nodes

.PHONY: node-assets
node-assets: $(NODE_ASSETS) ## Build kubelet, kube-controller-manager and kube-scheduler $(KUBE_VERSION) into the cache (once).

$(NODE_ASSETS):
	hack/envtest-assets.sh $(KUBE_VERSION) $(ENVTEST_ASSETS) $(notdir $@)

.PHONY: test-nodes
test-nodes: deps envtest-assets node-assets $(IMAGEBUILD) ## Run the real-node tests (root): kubelets, containerd and pods on the test bed.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) IMAGEBUILD=$(IMAGEBUILD) $(GO) test -count=1 -v ./test/testbed/nodes/
