# sandbox-executor. The two commands a new user needs:
#   make demo    bring up the local cluster (if needed) and run a Duo-shaped job through gitlab-runner
#   make check   everything CI runs: vet, unit tests with -race, the local cluster, e2e, security
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
export SANDBOX_EXECUTOR_CACHE ?= $(HOME)/.cache/sandbox-executor
export CLUSTER_DIR ?= $(SANDBOX_EXECUTOR_CACHE)/cluster
BIN := $(CURDIR)/bin
LDFLAGS := -s -w -X github.com/sandbox-executor/sandbox-executor/cmd/sandbox-executor/app.Version=$(VERSION)
# Static binaries: the agent is copied into job pods of any image.
GOBUILD := CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)'

.PHONY: all build test vet unit check cluster-up cluster-down cluster-wipe netpol e2e e2e-long security demo runner runner-test bench bench-scale clean

all: build

build:
	$(GOBUILD) -o $(BIN)/sandbox-executor ./cmd/sandbox-executor
	$(GOBUILD) -o $(BIN)/sandbox-executor-agent ./cmd/sandbox-executor-agent
	$(GOBUILD) -o $(BIN)/sandbox-egress-proxy ./cmd/sandbox-egress-proxy

vet:
	$(GO) vet ./...

# Unit tests: fake clientsets and a stubbed exec, with the race detector.
unit:
	$(GO) test -race -count=1 ./...

test: vet unit

# The README's test command: unit tests, then the real local cluster, the end-to-end suite and
# the security suite.
check: vet unit build runner runner-test cluster-up netpol e2e security

cluster-up:
	tests/cluster/up.sh

cluster-down:
	tests/cluster/down.sh

cluster-wipe:
	tests/cluster/down.sh --wipe

# NetworkPolicy is enforced on the local cluster (kube-router): a deny really denies.
netpol:
	tests/cluster/netpol-check.sh

# The real gitlab-runner (12.8, the newest the module proxy can build).
runner:
	tests/tools/gitlab-runner/build.sh

# The real gitlab-runner against the fake GitLab with a host-local executor: the harness itself.
runner-test: runner
	$(GO) test -tags runner -race -count=1 ./tests/runner/...

e2e: build
	SANDBOX_EXECUTOR_BIN=$(BIN) $(GO) test -tags e2e -count=1 -timeout 30m -v ./tests/e2e/...

# Jobs that try to break out of their sandbox (kernel, API, network, resources, privileges,
# secrets, leftovers, RBAC) and must fail; independent jobs run concurrently.
security: build
	SANDBOX_EXECUTOR_BIN=$(BIN) $(GO) test -tags security -count=1 -parallel 4 -timeout 20m -v ./tests/security/...

# Adds the slow cases (a stage silent for 10 minutes).
e2e-long: build
	SANDBOX_EXECUTOR_BIN=$(BIN) $(GO) test -tags 'e2e e2elong' -count=1 -timeout 60m -v -run 'Silent' ./tests/e2e/...

demo: build cluster-up runner
	SANDBOX_EXECUTOR_BIN=$(BIN) $(GO) run ./tests/demo

# Benchmarks against baselines measured in the same run; writes docs/benchmarks.md.
bench: build cluster-up runner
	SANDBOX_EXECUTOR_BIN=$(BIN) tests/bench.sh

# Control-plane scale: N concurrent claims against the real apiserver and agent-sandbox controller,
# with kwok-simulated nodes (tests/scale). SCALE_ARGS=-warm 100 -cold '' for a short run.
bench-scale: cluster-up
	tests/scale/run.sh $(SCALE_ARGS)

clean:
	rm -rf $(BIN)

# Static checks: formatting, vet with every build tag, and staticcheck (installed from the module
# proxy on first use).
STATICCHECK ?= $(shell $(GO) env GOPATH)/bin/staticcheck
STATICCHECK_VERSION ?= v0.8.2
.PHONY: lint
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt -l:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e,security,runner ./...
	test -x $(STATICCHECK) || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(STATICCHECK) ./...
	$(STATICCHECK) -tags e2e,security,runner ./...
