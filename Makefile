# cachetier — see README.md. Everything builds from the Go module proxy; the
# only prerequisites are Go and a C compiler.

K8S_VERSION            ?= v1.37.1
ETCD_VERSION           ?= v3.7.3
CONTROLLER_GEN_VERSION ?= v0.23.0

BIN            := $(CURDIR)/bin
CONTROLPLANE   := $(BIN)/k8s/$(K8S_VERSION)-linux-amd64
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)
GO_TEST_FLAGS  ?= -count=1 -timeout=40m

# Tests and envtest find the real kube-apiserver, etcd and kubectl here.
export KUBEBUILDER_ASSETS := $(CONTROLPLANE)

.PHONY: all
all: build

##@ Main jobs

.PHONY: run
FLEET   ?= 0
CLUSTER ?= processes
NODES   ?= 1

ifeq ($(CLUSTER),node)
RUN_DEPS := controlplane node-deps node-image
RUN_ARGS := --node --nodes $(NODES)
RUN_ENV  := CACHETIER_IMAGES=$(BIN)/images
else
RUN_DEPS := controlplane
RUN_ARGS := --cache-server $(BIN)/cache-server --fleet $(FLEET)
RUN_ENV  :=
endif

run: $(RUN_DEPS) ## Start a local control plane with sample data and the tier behind the aggregator (FLEET=N: N shard processes and a front; CLUSTER=node: a real cluster of NODES nodes (default 1), the operator installed from the image with kustomize, the sample profile's fleet as pods; needs root); Ctrl-C stops it.
	go build -o $(BIN)/localcluster ./hack/localcluster
	go build -o $(BIN)/cache-server ./cache-server
	$(RUN_ENV) $(BIN)/localcluster $(RUN_ARGS)

# e2e/observability spends most of its ~30 minutes waiting for alerts'
# `for:` (CachetierProfileDegraded's is 10 min) and rate windows to pass,
# with little CPU: it runs beside the other packages instead of taking its
# turn in go test's queue, where it would be the suite's tail. Its output
# follows theirs.
SOLO_PKG := e2e/observability

.PHONY: test
test: controlplane node-deps test-deps image vet test-race ## Everything CI runs: unit, fuzz seed corpora, integration tests against a real apiserver, promtool rule tests, end-to-end tests on a real node, and test-race.
	@log=$(BIN)/test-$(subst /,-,$(SOLO_PKG)).log; \
	CACHETIER_IMAGES=$(BIN)/images go test $(GO_TEST_FLAGS) -timeout=50m ./$(SOLO_PKG) > $$log 2>&1 & solo=$$!; \
	CACHETIER_IMAGES=$(BIN)/images go test $(GO_TEST_FLAGS) $$(go list ./... | grep -v '/$(SOLO_PKG)$$'); rc=$$?; \
	wait $$solo; solo_rc=$$?; cat $$log; \
	echo "make test: ./$(SOLO_PKG) (run beside the rest) exit $$solo_rc, the rest exit $$rc"; \
	[ $$rc -eq 0 ] && [ $$solo_rc -eq 0 ]

# The packages that are concurrent by design — ingestion and freshness
# waits, the store's readers and writers, watch fan-out, kept compressed
# chunks, per-connection auth caches, a fleet's shard calls and merged
# streams, shared waits, HTTP/2 serving — run their unit tests under the
# race detector too. -short leaves out the longest sequential walks of the
# fleet's model tests (page by page at a limit of 1), which `test` runs.
RACE_PKGS := $(addprefix ./cache-server/internal/,store watch gzipchunks auth fleet upstream front shardwire shardserver sharedwait serving seatcpu bulkthread)

.PHONY: test-race
test-race: controlplane ## The unit tests of the concurrent packages under the race detector (make test runs it first).
	go test -race -short $(GO_TEST_FLAGS) $(RACE_PKGS)

.PHONY: dashboard-png
dashboard-png: controlplane node-deps test-deps image ## Run e2e/observability (the Prometheus Operator and its Prometheus scraping a fleet on a real node; root) and draw every dashboard's panels from that run into docs/*.png.
	CACHETIER_IMAGES=$(BIN)/images CACHETIER_DASHBOARD_PNG_DIR=$(CURDIR)/bin/dashboards go test ./e2e/observability -run TestDashboardsAndAlerts -count=1 -v -timeout 50m
	cp bin/dashboards/cachetier-dashboard.png docs/dashboard.png
	cp bin/dashboards/cachetier-operator-dashboard.png docs/operator-dashboard.png

BENCH_FLAGS ?=

.PHONY: bench
bench: controlplane ## Benchmarks, the tier and the real kube-apiserver side by side on the same data: LIST by default, BENCH_FLAGS="-mode watch|nodes|apicost|..." for the others (see docs/benchmarks.md).
	go run ./hack/bench $(BENCH_FLAGS)

##@ Build

.PHONY: build
build: ## Build all binaries into bin/.
	CGO_ENABLED=0 go build -trimpath -o $(BIN)/ ./cmd/... ./cache-server/... ./hack/localcluster

.PHONY: image
image: ## Build the cachetier, pause, CoreDNS, network-probe, Prometheus Operator, config-reloader and Prometheus images as OCI archives into bin/images/ (no container engine needed; see images.json). IMAGES=a,b builds only those.
	go run ./hack/imagebuild/cmd/imagebuild -out $(BIN)/images $(if $(IMAGES),-images $(IMAGES))

# What `make run CLUSTER=node` runs (nodeinstall.ImageNames): the monitoring
# stack's images are for e2e/observability only.
.PHONY: node-image
node-image:
	$(MAKE) image IMAGES=cachetier,pause,coredns

.PHONY: node-deps
node-deps: ## Install the Debian packages a local node needs (containerd, runc, CNI plugins, iptables, conntrack) when any is missing (as root).
	hack/install-node-deps.sh

.PHONY: test-deps
test-deps: ## Install the Debian packages tests run (promtool, from prometheus: the alert rules' unit tests) when missing; as root it apt-get installs it.
	hack/install-debian-deps.sh promtool=prometheus

.PHONY: controlplane
controlplane: ## Build kube-apiserver, kubectl, etcd and the node's kubelet, kube-proxy, kube-scheduler, kube-controller-manager from the module proxy into bin/k8s/.
	K8S_VERSION=$(K8S_VERSION) ETCD_VERSION=$(ETCD_VERSION) CONTROLPLANE_DIR=$(CONTROLPLANE) hack/build-controlplane.sh

##@ Code generation

$(CONTROLLER_GEN):
	GOBIN=$(BIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(BIN)/controller-gen $@

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code for the API types.
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRD and the manager's RBAC from markers.
	$(CONTROLLER_GEN) crd rbac:roleName=manager-role paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac

##@ Hygiene

.PHONY: fmt
fmt: ## gofmt the tree.
	gofmt -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## go vet, and fail on unformatted files.
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "run make fmt"; exit 1; }
	go vet ./...

.PHONY: help
help: ## Show targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-14s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)
