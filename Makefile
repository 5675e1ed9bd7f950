# mci: Multi-Cluster Inference for Kubernetes.
#
#   make run          start a local ClusterSet (real kube-apiservers) with the examples
#   make test         codegen and docs checks, vet, unit tests (-short; they run every fuzz target's
#                     seed corpus), fuzz-smoke (3s of fuzzing per target that takes untrusted input),
#                     integration, chart, e2e, conformance (and its self-test), image, pods-start and
#                     release tests, soak-smoke, bench-smoke, bench-routing-smoke, bench-fleet-smoke
#   make fuzz         every fuzz target for FUZZTIME (60s) each; FUZZ_MATCH=<regexp> picks targets
#   make bench        benchmarks against the alternatives (docs/performance.md)
#   make bench-fleet  one mci-apiserver against mock fleets of 50, 200 and 1,000 members
#   make soak         the chaos soak (docs/performance.md, "Chaos soak"), SOAK_DURATION=20m
#   make plots        redraw docs/performance.md's plots from the latest bench and bench-routing results
#   make build        binaries into _output/bin
#   make test-conformance  the conformance suite against a local ClusterSet, full and summary modes
#   make test-compat  the e2e suite against the oldest Kubernetes the chart claims (its first run builds it)
#   make docs         regenerate docs/reference (flags, API) after changing flags or types
#   make images       container images into _output/images (OCI archives)
#   make release      VERSION=vX.Y.Z: multi-platform images, chart, SBOMs into _output/release
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

# The version every binary and image carries (pkg/version, --version,
# mci-apiserver's /version): hack/version.sh prints it, the commit and the
# tree state. VERSION=v1.2.3 overrides the version.
VERSION_INFO := $(shell hack/version.sh)
VERSION ?= $(word 1,$(VERSION_INFO))
GIT_COMMIT := $(word 2,$(VERSION_INFO))
GIT_TREE_STATE := $(word 3,$(VERSION_INFO))
VERSION_PKG := github.com/mci-dev/mci/pkg/version
GO_LDFLAGS := -s -w -X $(VERSION_PKG).gitVersion=$(VERSION) -X $(VERSION_PKG).gitCommit=$(GIT_COMMIT) -X $(VERSION_PKG).gitTreeState=$(GIT_TREE_STATE)

# Static binaries (CGO_ENABLED=0) without the symbol table and DWARF (-s -w,
# as Kubernetes releases are built; stack traces keep their file:line): the
# images copy them as they are.
.PHONY: build
build:
	@mkdir -p $(OUTPUT_BIN)
	CGO_ENABLED=0 go build -ldflags '$(GO_LDFLAGS)' -o $(OUTPUT_BIN)/ ./cmd/...

# make images: one image per binary (build/Containerfile), built with
# buildah (hack/install-buildah.sh installs it where missing) into
# _output/images/<binary>-$(VERSION).tar, an OCI archive holding the image
# <binary>:$(VERSION). Nothing is pulled from a registry; load one with
# e.g. `skopeo copy oci-archive:<file> docker://<registry>/<binary>:<tag>`.
# make test-images unpacks each image and runs its binary: --version, and
# mci-apiserver serving imports in a local ClusterSet.
IMAGES_DIR := $(CURDIR)/_output/images

.PHONY: images
images: build
	VERSION=$(VERSION) GIT_COMMIT=$(GIT_COMMIT) hack/build-images.sh

.PHONY: test-images
test-images: images tools
	MCI_BIN_DIR=$(OUTPUT_BIN) MCI_IMAGES_DIR=$(IMAGES_DIR) MCI_IMAGE_VERSION=$(VERSION) MCI_IMAGE_REVISION=$(GIT_COMMIT) \
	  go test $(GO_TEST_FLAGS) -count=1 -timeout 10m ./test/images/

# make test-pods-start: the chart's pods really start (test/podstart). It
# renders charts/mci for its defaults and a values file per mode, installs
# what it renders in a local ClusterSet, starts every container from the
# image's own file system (chrooted, as the chart's user: it must run as
# root) with the rendered command, args, env and volumes, runs every probe,
# reads InferencePoolImports through the chart's APIService and routes a
# request through the chart's mci-sidecar to another cluster's EPP
# (test/cmd/gateway stands for Envoy, whose image cannot be had here).
.PHONY: test-pods-start
test-pods-start: images tools helm test-programs
	MCI_BIN_DIR=$(OUTPUT_BIN) MCI_IMAGES_DIR=$(IMAGES_DIR) MCI_IMAGE_VERSION=$(VERSION) \
	  go test $(GO_TEST_FLAGS) -count=1 -v -timeout 20m ./test/podstart/

# make release VERSION=vX.Y.Z (docs/development.md, "Releasing"): into
# RELEASE_DIR (_output/release, emptied first; another directory must be
# empty), per binary an OCI archive of an image index for linux/amd64 and
# linux/arm64 and its CycloneDX SBOM, the packaged chart, the release notes
# (CHANGELOG.md's section for VERSION) and SHA256SUMS (hack/release.sh).
# VERSION must be given: the describe version of a tree is not a release.
# make test-release runs make release into a temporary directory and reads
# back what it wrote (test/release).
RELEASE_DIR ?= $(CURDIR)/_output/release
CHANGELOG ?= $(CURDIR)/CHANGELOG.md

.PHONY: release
release:
ifeq ($(origin VERSION),file)
	$(error make release needs the version: make release VERSION=vX.Y.Z)
endif
	@if [[ "$(RELEASE_DIR)" == "$(CURDIR)/_output/release" ]]; then rm -rf "$(RELEASE_DIR)"; fi
	VERSION=$(VERSION) GIT_COMMIT=$(GIT_COMMIT) GO_LDFLAGS='$(GO_LDFLAGS)' RELEASE_DIR=$(RELEASE_DIR) CHANGELOG=$(CHANGELOG) \
	  hack/release.sh

.PHONY: test-release
test-release:
	go test $(GO_TEST_FLAGS) -count=1 -timeout 30m ./test/release/

.PHONY: tools
tools:
	hack/build-kube-tools.sh

.PHONY: helm
helm:
	hack/build-helm.sh

.PHONY: codegen
codegen:
	hack/update-codegen.sh

.PHONY: docs
docs:
	hack/update-docs.sh

# make plots: the SVGs of docs/performance.md (docs/images/performance),
# drawn by hack/plots from the latest make bench and make bench-routing
# (their _output/.../results.json), which it first keeps under
# docs/performance-data; PLOTS_RESULTS names other results files,
# comma-separated (kept ones redraw the checked-in plots). hack/plots' test
# fails when a checked-in plot differs from what its results draw.
PLOTS_RESULTS ?= _output/bench/results.json,_output/bench-routing/results.json

.PHONY: plots
plots:
	go run ./hack/plots -results $(PLOTS_RESULTS) -keep docs/performance-data -out docs/images/performance

.PHONY: verify
verify:
	hack/verify-codegen.sh
	hack/verify-docs.sh
	@unformatted="$$(gofmt -l $$(git ls-files '*.go' | grep -v '^pkg/generated/'))"; \
	  if [[ -n "$$unformatted" ]]; then echo "gofmt needed: $$unformatted" >&2; exit 1; fi
	go vet ./...

# Unit tests run with -short: the tests that start a kube-apiserver and etcd
# (through test/localclusterset) or build and run a command skip, and
# test-integration runs them.
.PHONY: test-unit
test-unit:
	go test -short $(GO_TEST_FLAGS) -timeout 20m $$(go list ./... | grep -v -e /test/e2e -e /test/localclusterset -e /test/soak -e /test/chart -e /test/images -e /test/podstart -e /test/release)

# test-integration runs, without -short, every package of test-unit that has
# a test skipped under -short (found by its testing.Short() call), one
# package at a time: each starts its own kube-apiserver and etcd.
INTEGRATION_PKGS = $$(grep -rl --include='*_test.go' 'testing.Short()' pkg cmd test | grep -v -e ^test/e2e/ -e ^test/localclusterset/ -e ^test/soak/ -e ^test/chart/ -e ^test/images/ -e ^test/podstart/ -e ^test/release/ | xargs -n1 dirname | sort -u | sed 's|^|./|')

.PHONY: test-integration
test-integration: tools
	go test $(GO_TEST_FLAGS) -timeout 20m -p 1 $(INTEGRATION_PKGS)

# test-programs: the model-server simulator and the Envoy-like gateway
# double that the e2e tests, the soak and make run start.
.PHONY: test-programs
test-programs:
	@mkdir -p $(OUTPUT_BIN)
	go build -o $(OUTPUT_BIN)/ ./test/cmd/simulator ./test/cmd/gateway

# e2e tests start their own ClusterSet of real kube-apiservers.
.PHONY: test-e2e
test-e2e: build tools test-programs
	MCI_BIN_DIR=$(OUTPUT_BIN) go test $(GO_TEST_FLAGS) -timeout 40m -p 1 ./test/e2e/ ./test/localclusterset/

# make test-compat: the e2e suite against the oldest Kubernetes minor the
# chart claims (charts/mci kubeVersion), pinned in
# hack/tools/kube-apiserver-compat and built into _output/compat/bin (the
# first run compiles that kube-apiserver and kube-controller-manager: tens
# of minutes on 2 cores). make test runs the newest; this one is a target of
# its own for that first build's sake.
.PHONY: test-compat
test-compat: build tools test-programs
	hack/build-kube-tools.sh --compat
	MCI_BIN_DIR=$(CURDIR)/_output/compat/bin go test $(GO_TEST_FLAGS) -timeout 40m -p 1 ./test/e2e/ ./test/localclusterset/

# make test-conformance: the conformance suite (conformance/,
# docs/conformance.md) against a local ClusterSet of three clusters, once
# with mci-apiserver in full mode and once in summary mode
# (hack/test-conformance.sh), with the data path of make run for the
# Extended tests and the local ClusterSet's leave/join commands for the
# member-leaving test; each mode's report.yaml and report.html go to
# _output/conformance/<mode>/. CONFORMANCE_MODES=full runs one mode,
# CONFORMANCE_FLAGS passes flags to mci-conformance (--run=<regexp>).
.PHONY: test-conformance
test-conformance: build tools test-programs
	VERSION=$(VERSION) $(if $(CONFORMANCE_MODES),CONFORMANCE_MODES='$(CONFORMANCE_MODES)') $(if $(CONFORMANCE_FLAGS),CONFORMANCE_FLAGS='$(CONFORMANCE_FLAGS)') \
	  hack/test-conformance.sh

# make conformance-selftest: the Required tests must catch a broken
# implementation: test/conformance starts a local ClusterSet, checks that
# the chosen tests pass, breaks mci-apiserver one way at a time (no Exported
# condition written; an importer serving nothing), and expects those tests
# to fail.
.PHONY: conformance-selftest
conformance-selftest: build tools
	MCI_BIN_DIR=$(OUTPUT_BIN) MCI_CONFORMANCE_SELFTEST=1 go test $(GO_TEST_FLAGS) -count=1 -v -timeout 15m ./test/conformance/

# The Helm chart charts/mci (test/chart): it renders what the kustomize
# bases of artifacts/deploy render for the same settings, helm lint --strict
# accepts it, and a real kube-apiserver of a local ClusterSet admits it
# (server-side dry run). helm comes from its Go module (hack/build-helm.sh).
.PHONY: test-chart
test-chart: helm tools
	MCI_BIN_DIR=$(OUTPUT_BIN) go test $(GO_TEST_FLAGS) -count=1 -timeout 10m ./test/chart/

# test/docs also runs in test-unit; here it also asks the built binaries
# for their flags (--help), which catches a flag registered outside cmd/*/app.
.PHONY: test-docs
test-docs: build
	MCI_BIN_DIR=$(OUTPUT_BIN) go test $(GO_TEST_FLAGS) -count=1 ./test/docs/

.PHONY: test
test: verify test-unit fuzz-smoke test-integration test-docs test-chart test-e2e test-conformance conformance-selftest test-images test-pods-start test-release soak-smoke bench-smoke bench-routing-smoke bench-fleet-smoke

# make soak: the chaos soak of docs/performance.md ("Chaos soak"): a local
# ClusterSet of three clusters with two mci-apiserver replicas each, link
# proxies and the data path (loopback 127.0.231-233.x), under traffic,
# 50 watchers, export changes and a seeded random schedule of faults, for
# SOAK_DURATION (20m). SOAK_SEED=<n> replays a schedule (the seed is
# printed at the start and in the results); SOAK_RATE (10 req/s) and
# SOAK_WATCHERS (50) change the load. The tables go to stdout and to
# _output/soak/results.md and results.json; it fails when a target is
# missed, saying which and why. soak-smoke (part of make test) runs the
# same soak for 75s with seed 8 unless SOAK_SEED says otherwise (its 45s
# of faults then hold an error sink and a hung first byte, an etcd
# compaction, a member's namespace recreated, a rolling upgrade of the
# gateway cluster's mci-apiservers, a member's serving certificate
# renewed, a member's name that stops resolving, an EPP reset, partitions
# and a slow link), judging every target but the growth of the
# processes, which needs a longer run.
SOAK_DURATION ?= 20m
SOAK_SMOKE_SEED ?= 8
SOAK_ENV = MCI_BIN_DIR=$(OUTPUT_BIN) $(if $(SOAK_RATE),SOAK_RATE=$(SOAK_RATE)) $(if $(SOAK_WATCHERS),SOAK_WATCHERS=$(SOAK_WATCHERS))

.PHONY: soak
soak: build tools test-programs
	$(SOAK_ENV) $(if $(SOAK_SEED),SOAK_SEED=$(SOAK_SEED)) SOAK_DURATION=$(SOAK_DURATION) SOAK_OUT=$(CURDIR)/_output/soak go test -count=1 -v -timeout 3h ./test/soak/

.PHONY: soak-smoke
soak-smoke: build tools test-programs
	$(SOAK_ENV) SOAK_SEED=$(or $(SOAK_SEED),$(SOAK_SMOKE_SEED)) SOAK_DURATION=75s SOAK_OUT=$(CURDIR)/_output/soak-smoke go test -count=1 -v -timeout 10m ./test/soak/

# make bench: every measurement of docs/performance.md, on local ClusterSets
# of 3 and 10 clusters, against its baseline in the same run (15-20 minutes
# on 2 cores). The table goes to stdout and to _output/bench/results.md and
# results.json. Sizes: MCI_BENCH_* variables (test/bench/config_test.go).
# make bench-smoke runs the same code with tiny sizes (part of make test);
# make bench-micro runs the in-process Go benchmarks of ./pkg/...
# make bench ends with the latest routing-quality table of make bench-routing
# (which it does not rerun: that takes its own ~55 minutes).
BENCH_FLAGS := -run '^$$' -bench . -benchtime=1x -v

.PHONY: bench
bench: build tools test-programs
	MCI_BIN_DIR=$(OUTPUT_BIN) MCI_BENCH_OUT=$(CURDIR)/_output/bench go test $(BENCH_FLAGS) -timeout 30m ./test/bench/
	@if [[ -f _output/bench-routing/results.md ]]; then \
	  echo "Latest routing quality (make bench-routing, _output/bench-routing/results.json):"; cat _output/bench-routing/results.md; \
	else echo "No routing-quality results yet: run make bench-routing."; fi

# make bench-routing: routing quality (docs/performance.md, "Routing
# quality: the workload family"): a family of 7 seeded workloads (load 50 to
# 90%, 4 to 32 groups, 500- to 4,000-token system prompts, 2 to 8 batch
# places per server, multi-turn and one-shot mixes, a cluster 50 ms
# further, no shared prefix, a saturated cluster), each with PrefixAffinity,
# the peer reference HubReference, RoundRobin and the Oracle (MetricsBased
# on the saturated one; PrefixAffinity through 3 mci-sidecar replicas on
# shared-prompts), on a local ClusterSet of 3 clusters with simulated model
# servers that model prefix caching; then ten held-out workloads drawn
# from seeds nobody tunes on (test/benchrouting/heldout_test.go), each with
# the same policies, and a table of mci's PrefixAffinity against the hub
# configuration and the oracle on each and on the worst; among them,
# traffic the sidecar does not see (test/benchrouting/unseen_test.go):
# direct-30 and direct-60 (30% or 60% of the requests from the exporters'
# own users, sent to their own gateway) and two-importers (a second
# importing cluster's sidecar with its own users, in a fourth cluster that
# serves no pool), each with a held-out drawn one
# (about 100 minutes on 2 cores in all: those of traffic the sidecar
# does not see run four repetitions, the others two). Each workload's table, a summary over the family
# against the routing targets and the held-out table go to stdout and to
# _output/bench-routing/results.md and results.json.
# MCI_BENCH_ROUTING_* variables (test/benchrouting/config_test.go) change
# the run: _WORKLOADS=shared-prompts,far-remote picks workloads (held-out-<seed>
# and tuning-<seed> name drawn ones, held-out-direct-30-<seed> and the like
# those of unseen traffic), _LOOPBACK_BLOCK=251 moves the clusters' loopback
# addresses (two runs on one machine),
# _POLICIES=Weighted,PrefixAffinity@3,Oracle compares any cluster policy
# names (<policy>@<n>: through n sidecar replicas), _RECORDS=<dir> writes
# each run's requests there, one JSON line each (sent when, served where,
# TTFT), to tell what a tail is made of. bench-routing-smoke
# (part of make test) runs two workloads of the family, one case of
# traffic the sidecar does not see (both ways in one workload) and one
# held-out workload for seconds per policy, the replica case included, and
# checks the results' shape and sanity, not the targets.
BENCH_ROUTING_FLAGS := -run '^$$' -bench BenchmarkRouting -benchtime=1x -v

.PHONY: bench-routing
bench-routing: build tools test-programs
	MCI_BIN_DIR=$(OUTPUT_BIN) MCI_BENCH_ROUTING_OUT=$(CURDIR)/_output/bench-routing go test $(BENCH_ROUTING_FLAGS) -timeout 150m ./test/benchrouting/

.PHONY: bench-routing-smoke
bench-routing-smoke: build tools test-programs
	MCI_BIN_DIR=$(OUTPUT_BIN) MCI_BENCH_PROFILE=smoke MCI_BENCH_ROUTING_OUT=$(CURDIR)/_output/bench-routing-smoke go test $(BENCH_ROUTING_FLAGS) -timeout 5m ./test/benchrouting/

.PHONY: bench-smoke
bench-smoke: build tools test-programs
	MCI_BIN_DIR=$(OUTPUT_BIN) MCI_BENCH_PROFILE=smoke MCI_BENCH_OUT=$(CURDIR)/_output/bench-smoke go test $(BENCH_FLAGS) -timeout 5m ./test/bench/

# make bench-fleet: one real mci-apiserver in summary mode against mock
# fleets of 50, 200 and 1,000 members of 10 pools each (test/fleetmeasure,
# docs/performance.md "One importer against a mock fleet"): start to
# consistent, heap and goroutines per member, export changes under churn
# and a restart of 100 members at once; the server's heap and
# goroutine profiles go to _output/bench-fleet. FLEET_MEMBERS=<n,...>
# picks the sizes. bench-fleet-smoke (part of make test) runs 50 members
# and holds them to the test's regression bounds.
FLEET_MEMBERS ?= 50,200,1000

.PHONY: bench-fleet
bench-fleet: build tools
	mkdir -p _output/bench-fleet
	MCI_BIN_DIR=$(OUTPUT_BIN) MCI_FLEET_MEMBERS=$(FLEET_MEMBERS) MCI_FLEET_PROFILES=$(CURDIR)/_output/bench-fleet go test -count=1 -v -timeout 60m ./test/fleetmeasure/

.PHONY: bench-fleet-smoke
bench-fleet-smoke: build tools
	MCI_BIN_DIR=$(OUTPUT_BIN) MCI_FLEET_MEMBERS=50 MCI_FLEET_CHECK=1 go test -count=1 -v -timeout 10m ./test/fleetmeasure/

.PHONY: bench-micro
bench-micro:
	go test -run '^$$' -bench . -benchmem ./pkg/...

# make fuzz: every fuzz target of pkg/ and cmd/ for FUZZTIME (60s) each,
# one after the other. hack/fuzz.sh finds them in the source (every
# FuzzXxx of a _test.go file), so a new target needs no list.
# FUZZ_MATCH=<regexp> picks targets by name.
# fuzz-smoke (part of make test; the seed corpora already ran as ordinary
# tests in test-unit) fuzzes for FUZZ_SMOKE_TIME (3s) each target that
# takes input across a trust boundary: all of them but those whose doc
# comment has a "Trusted input:" line. A crash fails it once every target
# has run, printing the input go test wrote to testdata/fuzz/ and the
# command that replays it (docs/development.md, "Fuzzing").
FUZZTIME ?= 60s
FUZZ_SMOKE_TIME ?= 3s
FUZZ_ENV = $(if $(FUZZ_MATCH),FUZZ_MATCH='$(FUZZ_MATCH)')

.PHONY: fuzz
fuzz:
	FUZZTIME=$(FUZZTIME) $(FUZZ_ENV) hack/fuzz.sh

.PHONY: fuzz-smoke
fuzz-smoke:
	FUZZ_SMOKE_TIME=$(FUZZ_SMOKE_TIME) $(FUZZ_ENV) hack/fuzz.sh --smoke

.PHONY: clusterset-up
clusterset-up: build tools
	go run ./test/cmd/clusterset up --clusters=$(CLUSTERS) --dir=$(CLUSTERSET_DIR) --mci-apiserver=$(OUTPUT_BIN)/mci-apiserver

.PHONY: clusterset-down
clusterset-down:
	go run ./test/cmd/clusterset down --dir=$(CLUSTERSET_DIR)

# The data path of make run: model-server simulators behind mci-epp in
# cluster-a and cluster-c, mci-sidecar and an Envoy-like gateway in
# cluster-b, on 127.0.<DATAPATH_LOOPBACK_BLOCK + cluster index>.x.
DATAPATH_LOOPBACK_BLOCK ?= 90

.PHONY: run
run: clusterset-up test-programs
	go run ./test/cmd/clusterset apply-examples --dir=$(CLUSTERSET_DIR) --examples=$(CURDIR)/artifacts/examples \
	  --datapath --datapath-loopback-block=$(DATAPATH_LOOPBACK_BLOCK)
