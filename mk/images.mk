# Container images: each one static Go binary on an empty base (the C test
# client: a program with its C library),
# built without a container engine or a registry by hack/tools/imagebuild
# (go-containerregistry as a library, pinned in hack/tools/go.mod) into
# reproducible archives that `ctr images import`, `kind load image-archive`
# and `docker load` accept (docs/install.md#images).

# Must match hack/tools/go.mod (checked when building the builder).
GGCR_VERSION := v0.22.1
# The builder is this repository's code: its cache key is the pinned library
# and a hash of its sources, so an edit rebuilds it.
IMAGEBUILD_KEY := $(shell cat hack/tools/imagebuild/*.go hack/tools/go.sum 2>/dev/null | sha256sum | cut -c1-12)
IMAGEBUILD := $(CACHE_DIR)/tools/imagebuild-$(GGCR_VERSION)-$(IMAGEBUILD_KEY)
IMAGES_DIR ?= $(CURDIR)/_output/images
IMAGE_REGISTRY ?= ghcr.io/mptcp-operator
IMAGE_ARCH ?= $(shell $(GO) env GOARCH)

##@ Images

$(IMAGEBUILD):
	@mkdir -p $(dir $@)
	@pinned=$$(cd hack/tools && $(GO) list -m -f '{{.Version}}' github.com/google/go-containerregistry); \
		[ "$$pinned" = "$(GGCR_VERSION)" ] || { echo "hack/tools/go.mod pins go-containerregistry $$pinned, mk/images.mk says $(GGCR_VERSION)" >&2; exit 1; }
	cd hack/tools && $(GO) build -o $@.tmp ./imagebuild && mv $@.tmp $@

.PHONY: imagebuild
imagebuild: $(IMAGEBUILD) ## Build the image builder (hack/tools/imagebuild) into the cache.

.PHONY: images
images: $(IMAGEBUILD) ## Build controller, agent, traffic, libc-client, conformance and pause images into _output/images/<name>.tar, digests in images.json.
	$(IMAGEBUILD) -repo $(CURDIR) -out $(IMAGES_DIR) -registry $(IMAGE_REGISTRY) -arch $(IMAGE_ARCH)

.PHONY: test-images
test-images: $(IMAGEBUILD) ## Build the images twice: same bytes, static binaries, users and labels as documented.
	IMAGEBUILD=$(IMAGEBUILD) $(GO) test -count=1 ./hack/images/

.PHONY: print-imagebuild
print-imagebuild: ## Print the image builder's path (for IMAGEBUILD= when running go test by hand).
	@echo $(IMAGEBUILD)

# `make test` runs hack/images too.
test: $(IMAGEBUILD)
test: export IMAGEBUILD := $(IMAGEBUILD)
