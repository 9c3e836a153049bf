# sandbox-executor. The two commands a new user needs:
#   make demo    bring up the local cluster (if needed) and run a Duo-shaped job through gitlab-runner
#   make check   everything CI runs (tests/check.sh): lint, unit tests with -race, the real runner,
#                the local cluster, e2e, security; every suite runs and every failure is reported
SHELL := /bin/bash
comma := ,
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Evaluated once: binaries, images and chart of one make run carry the same version even if the
# tree changes while it runs.
VERSION := $(VERSION)
export SANDBOX_EXECUTOR_CACHE ?= $(HOME)/.cache/sandbox-executor
export CLUSTER_DIR ?= $(SANDBOX_EXECUTOR_CACHE)/cluster
BIN := $(CURDIR)/bin
LOGS := $(SANDBOX_EXECUTOR_CACHE)/logs
TOOLS := $(SANDBOX_EXECUTOR_CACHE)/tools
GOTESTSUM_VERSION := v1.13.0
GOTESTSUM := $(TOOLS)/gotestsum-$(GOTESTSUM_VERSION)
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)
# gci checks the import grouping gofmt leaves alone: standard, third-party, this module.
GCI_VERSION := v0.13.7
GCI := $(TOOLS)/gci-$(GCI_VERSION)
# helm for the chart's lint and rendering tests (unit suite) and make release; built from the
# module proxy (about 4 minutes on 2 cores the first time, then cached). The -X flags give it
# what helm's own release build stamps in: its version and the Kubernetes version that
# `helm template` and `helm lint` assume.
HELM_VERSION := v3.19.5
HELM := $(TOOLS)/helm-$(HELM_VERSION)
HELM_LDFLAGS := -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=34
# promtool for the alert rules' tests (unit suite), from the module proxy. -tags remove_all_sd
# leaves out Prometheus's cloud service discoveries (AWS, Azure, GCE, ...), which promtool's
# rule tests never use and which are most of its build: 4 CPU-minutes from an empty build cache
# (3m20s user + 45s sys), about 2-3 minutes on 2 idle cores, then cached.
PROMTOOL_VERSION := v0.316.0
PROMTOOL := $(TOOLS)/promtool-$(PROMTOOL_VERSION)
# go test through gotestsum, with its output format; tests/check.sh sets TEST_JSON to keep the
# events it counts.
gotest = $(GOTESTSUM) --format $(1) $(if $(TEST_JSON),--jsonfile $(TEST_JSON)) --
LDFLAGS := -s -w -X github.com/sandbox-executor/sandbox-executor/buildinfo.Version=$(VERSION)
# Without cgo everywhere but under -race (which needs it): vet, the binaries and the suites' test
# binaries then compile every dependency the same way, once, where cgo on for some and off for
# others (and -trimpath for some) compiled them three times on a fresh machine (about 6 minutes).
export CGO_ENABLED := 0
RACE := CGO_ENABLED=1
# Static binaries: the agent is copied into job pods of any image. make release adds -trimpath
# (reproducible paths); make build leaves it out so its compiles are the ones vet made.
GOBUILD = CGO_ENABLED=0 $(GO) build $(TRIMPATH) -ldflags '$(LDFLAGS)'

.PHONY: all modules host-packages helm helm-path images release build test lint vet unit check cluster-up cluster-down cluster-wipe netpol e2e e2e-long security soak soak-short perf-smoke demo runner runner-test bench bench-scale clean

all: build

# Module downloads go to a log instead of the terminal (a fresh machine fetches hundreds).
modules:
	@mkdir -p $(LOGS)
	@$(GO) mod download >$(LOGS)/go-mod-download.log 2>&1 || { tail -n 20 $(LOGS)/go-mod-download.log; exit 1; }

# Test tools, pinned, from the Go module proxy: $(call install_tool,PACKAGE,VERSION[,GO INSTALL FLAGS]).
# Each install has a directory of its own and ends in a rename: make check runs cluster-up (which
# installs helm) beside the unit suite (which does too), and two installs must not mix.
install_tool = mkdir -p $(TOOLS) && gobin=$$(mktemp -d $(TOOLS)/.install.XXXXXX) && \
	echo "installing $(notdir $(1)) $(2) (log: $(LOGS)/tools.log)" && \
	{ GOBIN=$$gobin $(GO) install $(3) $(1)@$(2) >>$(LOGS)/tools.log 2>&1 && mv $$gobin/$(notdir $(1)) $@ && rmdir $$gobin || \
	{ rm -rf $$gobin; tail -n 20 $(LOGS)/tools.log; exit 1; }; }

$(GOTESTSUM): | modules
	@$(call install_tool,gotest.tools/gotestsum,$(GOTESTSUM_VERSION))

$(STATICCHECK): | modules
	@$(call install_tool,honnef.co/go/tools/cmd/staticcheck,$(STATICCHECK_VERSION))

$(GCI): | modules
	@$(call install_tool,github.com/daixiang0/gci,$(GCI_VERSION))

$(HELM): | modules
	@$(call install_tool,helm.sh/helm/v3/cmd/helm,$(HELM_VERSION),-ldflags '$(HELM_LDFLAGS)')

helm: $(HELM)

$(PROMTOOL): | modules
	@$(call install_tool,github.com/prometheus/prometheus/cmd/promtool,$(PROMTOOL_VERSION),-tags remove_all_sd)

helm-path: $(HELM)
	@echo $(HELM)

# sandbox-executor-metrics-adapter is a binary of its own: it links k8s.io/apiserver, which the
# executor the runner starts for every stage must not carry. sandbox-executor-stage, the stage
# launcher, links none of client-go: it hands prepare and cleanup to the stage server.
COMMANDS := sandbox-executor sandbox-executor-stage sandbox-executor-agent sandbox-egress-proxy sandbox-executor-metrics-adapter

build: modules
	@for cmd in $(COMMANDS); do echo "$(GOBUILD) -o $(BIN)/$$cmd ./cmd/$$cmd"; $(GOBUILD) -o $(BIN)/$$cmd ./cmd/$$cmd || exit 1; done

# The same static binaries for linux/ARCH, in bin/linux-ARCH (images and release).
build-linux-%: modules
	@for cmd in $(COMMANDS); do GOOS=linux GOARCH=$* $(GOBUILD) -o $(BIN)/linux-$*/$$cmd ./cmd/$$cmd || exit 1; done
	@echo "built $(COMMANDS) for linux/$* in $(BIN)/linux-$*"

# The images (tools/images, no Docker): agent, executor (gc), egress proxy and runner, as OCI
# archives in dist/images, tagged $(VERSION); imported into the local cluster's containerd when
# it runs. IMAGE_REPO names them for a registry; IMAGE_ARCH=arm64 builds the arm64 set (the
# runner image then needs arm64 gitlab-runner binaries in RUNNER_DIR).
DIST := $(CURDIR)/dist
IMAGE_REPO ?= sandbox-executor.local
IMAGE_ARCH ?= amd64
images: build-linux-$(IMAGE_ARCH) runner
	$(GO) run ./tools/images -bin $(BIN)/linux-$(IMAGE_ARCH) -runner $(RUNNER_DIR) -arch $(IMAGE_ARCH) \
		-repo $(IMAGE_REPO) -tag $(VERSION) -out $(DIST)/images
	tests/cluster/images.sh import-archives $(DIST)/images

# A release, all stamped $(VERSION): static binaries for linux/amd64 and linux/arm64, the amd64
# images as OCI archives, the packaged chart (appVersion $(VERSION): its images' tag), and
# SHA256SUMS over all of it.
CHART_VERSION := $(if $(filter v%,$(VERSION)),$(patsubst v%,%,$(VERSION)),0.0.0-g$(VERSION))
RELEASE := $(DIST)/release/$(VERSION)
release: TRIMPATH := -trimpath
release: build-linux-amd64 build-linux-arm64 $(HELM) runner
	rm -rf $(RELEASE) && mkdir -p $(RELEASE)/images
	@for arch in amd64 arm64; do for cmd in $(COMMANDS); do \
		cp $(BIN)/linux-$$arch/$$cmd $(RELEASE)/$${cmd}_$(VERSION)_linux_$$arch || exit 1; done; done
	$(GO) run ./tools/images -bin $(BIN)/linux-amd64 -runner $(RUNNER_DIR) -arch amd64 -repo $(IMAGE_REPO) -tag $(VERSION) -out $(RELEASE)/images
	$(HELM) lint deploy/chart/sandbox-executor
	$(HELM) package deploy/chart/sandbox-executor --version $(CHART_VERSION) --app-version $(VERSION) -d $(RELEASE)
	cd $(RELEASE) && sha256sum $$(find . -type f ! -name SHA256SUMS | sort) >SHA256SUMS
	@echo "release $(VERSION) (chart $(CHART_VERSION)) in $(RELEASE)"

# Formatting, import groups, test file names (tests/README.md#conventions), vet and staticcheck
# with every build tag the suites use. One run each: no file is built only without a suite's tag
# (lint refuses a negated one), so the tagged build holds every file of the untagged one and a
# second, untagged run would check a subset again.
SUITE_TAGS := e2e,security,runner,soak
lint: modules $(STATICCHECK) $(GCI)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [[ -n $$unformatted ]]; then echo "not gofmt'ed: $$unformatted"; exit 1; fi
	@misgrouped=$$($(GCI) list -s standard -s default -s "prefix(github.com/sandbox-executor/sandbox-executor)" --skip-generated $$(git ls-files '*.go')); \
		if [[ -n $$misgrouped ]]; then echo "imports not grouped standard, third-party, module (gci write with the same sections fixes it): $$misgrouped"; exit 1; fi
	@tests/lint-test-names.sh
	@negated=$$(git grep -lE '^//go:build.*!\(?($(subst $(comma),|,$(SUITE_TAGS)))\b' -- '*.go'); \
		if [[ -n $$negated ]]; then echo "a file built only without a suite's tag escapes make lint's one tagged run: $$negated"; exit 1; fi
	$(GO) vet -tags $(SUITE_TAGS) ./...
	$(STATICCHECK) -tags $(SUITE_TAGS) ./...

vet: lint

# The host's Debian packages (tests/cluster/deps.sh; apt-get only when one is missing): the
# cluster needs them, and so do unit tests that use the host's kernel (agent/netfence reads its
# tables back with iptables-legacy-save), which on a fresh machine run before the cluster is up.
host-packages:
	@tests/cluster/deps.sh

# Unit tests: fake clientsets and a stubbed exec, with the race detector; the chart's lint and
# rendering tests (tests/chart) run the pinned helm.
unit: host-packages $(GOTESTSUM) $(HELM) $(PROMTOOL)
	$(RACE) SANDBOX_EXECUTOR_HELM=$(HELM) SANDBOX_EXECUTOR_PROMTOOL=$(PROMTOOL) $(call gotest,pkgname) -race -count=1 ./...
	$(MAKE) --no-print-directory fuzz FUZZTIME=$(UNIT_FUZZTIME)

# Fuzzing (tests/fuzz.sh): every fuzz target in the module, found by its `func Fuzz` line in a
# _test.go file, each fuzzed for FUZZTIME. A crasher is saved under the package's
# testdata/fuzz/<target>/ and, committed, runs in every go test from then on, as the seed corpora
# there do. Each package's fuzzing test binary is built once (go test -fuzz links it again for
# every target), and FUZZ_JOBS targets fuzz at once: with 2 on the 2 cores each has one worker,
# not two, so a target runs about a third to a half of the inputs it did alone (FUZZ_JOBS=1
# gives each target every core). make unit runs each for UNIT_FUZZTIME (24 targets in 10
# packages: about 1m20s, 2m25s with FUZZ_JOBS=1, 3 minutes through go test one at a time; and
# the fuzzing build of their dependencies once per machine); make fuzz runs each for 5m (an hour).
FUZZTIME ?= 5m
UNIT_FUZZTIME ?= 5s
FUZZ_JOBS ?= 2
# Go 1.26's fuzzing coordinator can fail a run that found nothing with "context deadline
# exceeded" as -fuzztime ends (go.dev/issue/75804, a race between the deadline and the workers'
# stop; seen in make check on FuzzReadFrames); Go 1.27 fixed it. So the fuzz runs alone use
# Go 1.27.3, which the go command takes from the module proxy like a module (about 76 MB, once
# per machine); the module and everything else stay on the machine's Go 1.26. -vet=off (in
# tests/fuzz.sh): make lint vets the tree, and vet would otherwise compute its facts for every
# dependency again with the second toolchain.
FUZZ_GO ?= env GOTOOLCHAIN=go1.27.3 $(GO)
.PHONY: fuzz
fuzz: modules
	@FUZZTIME=$(FUZZTIME) FUZZ_JOBS=$(FUZZ_JOBS) FUZZ_GO='$(FUZZ_GO)' tests/fuzz.sh

test: lint unit

# The README's test command: every suite, each reported, even after a failure (tests/check.sh).
check:
	@tests/check.sh

cluster-up:
	tests/cluster/up.sh

cluster-down:
	tests/cluster/down.sh

cluster-wipe:
	tests/cluster/down.sh --wipe

# NetworkPolicy is enforced on the local cluster (kube-router): a deny really denies.
netpol:
	tests/cluster/netpol-check.sh

# The real GitLab Runner 17.9.0 binaries in ../shared/tools (see tests/runner), or the ones
# SANDBOX_EXECUTOR_GITLAB_RUNNER and SANDBOX_EXECUTOR_GITLAB_RUNNER_HELPER name: nothing to build,
# check that both run and say which versions the suites will use.
RUNNER_DIR := $(abspath $(CURDIR)/../shared/tools/gitlab-runner-17.9.0)
runner:
	@runner="$${SANDBOX_EXECUTOR_GITLAB_RUNNER:-$(RUNNER_DIR)/gitlab-runner}"; \
	helper="$${SANDBOX_EXECUTOR_GITLAB_RUNNER_HELPER:-$$(dirname "$$runner")/gitlab-runner-helper}"; \
	for bin in "$$runner" "$$helper"; do \
		version=$$("$$bin" --version 2>/dev/null | awk '/^Version:/ {print $$2}'); \
		if [ -z "$$version" ]; then \
			echo "runner: $$bin does not run (set SANDBOX_EXECUTOR_GITLAB_RUNNER, SANDBOX_EXECUTOR_GITLAB_RUNNER_HELPER)" >&2; exit 1; \
		fi; \
		echo "$$bin: $$version"; \
	done

# The real gitlab-runner against the fake GitLab with a host-local executor: the harness itself.
runner-test: runner $(GOTESTSUM)
	$(RACE) $(call gotest,pkgname) -tags runner -race -count=1 ./tests/runner/...

# The e2e tests that break or hold a shared component (tests/README.md#serial-and-parallel-tests)
# do not call t.Parallel: go test runs them first, one at a time, with nothing else running. The
# others share the cluster, at most E2E_PARALLEL at a time: the node has 2 cores, and duo-default's
# 2 warm pods are what they contend for (a job that finds none waits for a cold start).
E2E_PARALLEL ?= 3
e2e: build images $(GOTESTSUM)
	SANDBOX_EXECUTOR_BIN=$(BIN) $(call gotest,standard-verbose) -tags e2e -count=1 -parallel $(E2E_PARALLEL) -timeout 30m ./tests/e2e/...

# Jobs that try to break out of their sandbox (kernel, API, network, resources, privileges,
# secrets, leftovers, RBAC) and must fail; independent jobs run concurrently.
security: build $(GOTESTSUM)
	SANDBOX_EXECUTOR_BIN=$(BIN) $(call gotest,standard-verbose) -tags security -count=1 -parallel 4 -timeout 30m ./tests/security/...

# The soak (tests/soak, docs/reliability.md): SOAK_JOBS jobs of mixed kinds through the chart's
# in-cluster install under a seeded random schedule of faults, every invariant checked over every
# job. SOAK_SEED replays a run (its seed is printed first); the report goes to dist/soak-report.md.
SOAK_JOBS ?= 200
soak: build images $(GOTESTSUM)
	@mkdir -p dist
	SANDBOX_EXECUTOR_BIN=$(BIN) SOAK_JOBS=$(SOAK_JOBS) SOAK_REPORT=$(CURDIR)/dist/soak-report.md $(call gotest,standard-verbose) -tags soak -count=1 -timeout 150m ./tests/soak/...

# make check's short soak: the same with a fixed seed whose 18 jobs draw all ten kinds, under
# four faults (agent-kill, pod-delete, stream-drop, controller-restart). A job here costs the
# 2-core cluster about 20 s (each takes a pod, and a pod's start and end cost about 12
# CPU-seconds: tests/README.md), so the job count is the suite's time.
soak-short: build images $(GOTESTSUM)
	SANDBOX_EXECUTOR_BIN=$(BIN) SOAK_JOBS=18 SOAK_SEED=20261469 $(call gotest,standard-verbose) -tags soak -count=1 -timeout 30m ./tests/soak/...

# make check's performance smoke (tests/e2e/bench_smoke_test.go, about a minute): SMOKE_N hello jobs
# at rest and back to back through gitlab-runner and the stage server, against agent-sandbox's
# own claim and the runner alone plus the same stage scripts by a raw exec, measured in the same
# run. A job that fails fails it; a slow one does not: tests/check.sh prints the ratios and warns
# about those more than half worse than docs/benchmarks.md's (tests/checkreport).
SMOKE_N ?= 5
perf-smoke: build runner
	SANDBOX_EXECUTOR_BIN=$(BIN) SMOKE_N=$(SMOKE_N) $(GO) test -tags e2e -count=1 -run '^$$' -bench '^BenchmarkSmoke$$' -benchtime 1x -timeout 10m ./tests/e2e/

# Adds the slow cases (a stage silent for 10 minutes).
e2e-long: build
	SANDBOX_EXECUTOR_BIN=$(BIN) $(GO) test -tags 'e2e e2elong' -count=1 -timeout 60m -v -run 'Silent' ./tests/e2e/...

demo: build cluster-up images
	SANDBOX_EXECUTOR_BIN=$(BIN) $(GO) run ./tools/demo

# Benchmarks against baselines measured in the same run; writes docs/benchmarks.md.
bench: build cluster-up runner
	SANDBOX_EXECUTOR_BIN=$(BIN) tests/bench.sh

# Control-plane scale: N concurrent claims against the real apiserver and agent-sandbox controller,
# with kwok-simulated nodes (tools/scale). SCALE_ARGS=-warm 100 -cold '' for a short run.
bench-scale: cluster-up
	tools/scale/run.sh $(SCALE_ARGS)

clean:
	rm -rf $(BIN)
