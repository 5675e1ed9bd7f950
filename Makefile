# mci: Multi-Cluster Inference for Kubernetes.
#
#   make run          start a local ClusterSet (real kube-apiservers) with the examples
#   make test         codegen check, vet, unit and e2e tests
#   make build        binaries into _output/bin
#
# The first run on a fresh machine builds kube-apiserver and etcd from their
# Go modules (several minutes on 2 cores); later runs reuse _output/bin.

SHELL := /usr/bin/env bash
OUTPUT_BIN := $(CURDIR)/_output/bin
CLUSTERS ?= 3
CLUSTERSET_DIR ?= $(CURDIR)/_output/clusterset
GO_TEST_FLAGS ?=

.PHONY: all
all: build

.PHONY: build
build:
	@mkdir -p $(OUTPUT_BIN)
	go build -o $(OUTPUT_BIN)/ ./cmd/...

.PHONY: tools
tools:
	hack/build-kube-tools.sh

.PHONY: codegen
codegen:
	hack/update-codegen.sh

.PHONY: verify
verify:
	hack/verify-codegen.sh
	@unformatted="$$(gofmt -l $$(git ls-files '*.go' | grep -v '^pkg/generated/'))"; \
	  if [[ -n "$$unformatted" ]]; then echo "gofmt needed: $$unformatted" >&2; exit 1; fi
	go vet ./...

.PHONY: test-unit
test-unit: tools
	go test $(GO_TEST_FLAGS) -timeout 20m $$(go list ./... | grep -v -e /test/e2e -e /test/clusterset)

# e2e tests start their own ClusterSet of real kube-apiservers.
.PHONY: test-e2e
test-e2e: build tools
	MCI_BIN_DIR=$(OUTPUT_BIN) go test $(GO_TEST_FLAGS) -timeout 40m -p 1 ./test/e2e/ ./test/clusterset/

.PHONY: test
test: verify test-unit test-e2e

.PHONY: bench
bench: build tools
	go test -run '^$$' -bench . -benchmem ./pkg/...
	MCI_BIN_DIR=$(OUTPUT_BIN) go test -run '^$$' -bench . -benchtime=1x -timeout 30m -v ./test/bench/

.PHONY: clusterset-up
clusterset-up: build tools
	go run ./test/cmd/clusterset up --clusters=$(CLUSTERS) --dir=$(CLUSTERSET_DIR) --mci-apiserver=$(OUTPUT_BIN)/mci-apiserver

.PHONY: clusterset-down
clusterset-down:
	go run ./test/cmd/clusterset down --dir=$(CLUSTERSET_DIR)

.PHONY: run
run: clusterset-up
	go run ./test/cmd/clusterset apply-examples --dir=$(CLUSTERSET_DIR) --examples=$(CURDIR)/artifacts/examples
