# mptcp-operator: multipath transport for tenant pods over a node's several NICs.
# `make help` lists the targets. Tool versions are pinned in mk/tools.mk.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

BIN ?= $(CURDIR)/bin
# Caches that outlive a clone (kube-apiserver build, tools), keyed by version.
CACHE_DIR ?= $(HOME)/.cache/mptcp-operator
GO ?= go
# go.mod and go.sum are as committed: a command that would change them
# fails instead (-mod=readonly, the go command's default) rather than
# leaving go.sum with lines `go mod tidy` removes.

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z0-9_.-]+:.*?##/ { printf "  \033[36m%-22s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

include mk/*.mk
