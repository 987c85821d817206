# Cairn: `make run` builds the default image and boots it in QEMU;
# `make test` runs every test, including one QEMU boot.

VERSION ?= 0.1.0
OUT     ?= _out
BIN     := $(OUT)/bin
GO      ?= go
# Node binaries are static and reproducible: no cgo, no paths, no build IDs.
GOFLAGS_NODE := -trimpath -buildvcs=false
LDFLAGS := -s -w -buildid= -X github.com/cairn-os/cairn/internal/version.Version=$(VERSION)

export CGO_ENABLED := 0

.PHONY: all deps components build image run test test-unit test-e2e test-cluster test-powercut demo conformance-cluster bench bench-build bench-pods bench-streams bench-storage bench-proxy bench-podnet bench-policy bench-cluster proto clean

all: build

deps:
	@./hack/deps.sh

# The node's components that are programs of their own, runc and the CNI
# plugins, built from their own module in rootfs/components (see
# hack/build-components.sh); rebuilt only when their pins change.
COMPONENTS := $(BIN)/runc $(addprefix $(BIN)/cni/,bridge host-local loopback portmap)

components: $(COMPONENTS)

$(COMPONENTS) &: rootfs/components/go.mod rootfs/components/go.sum hack/build-components.sh
	GO=$(GO) ./hack/build-components.sh $(BIN)

# The control plane for tests (test/kube), built from its own module in
# test/cluster (see hack/build-cluster.sh); rebuilt only when its pins or the
# script change. A cold build takes 10-25 minutes on 2 cores.
CLUSTER_BIN := $(OUT)/cluster/bin
CLUSTER := $(addprefix $(CLUSTER_BIN)/,kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl etcd)

.PHONY: cluster
cluster: $(CLUSTER)

$(CLUSTER) &: test/cluster/go.mod test/cluster/go.sum hack/build-cluster.sh
	GO=$(GO) ./hack/build-cluster.sh $(CLUSTER_BIN)

# CoreDNS, the DNS of cairn qemu cluster's clusters, from its own module in
# test/cluster/coredns (see hack/build-coredns.sh), beside the control
# plane; rebuilt only when its pins change. About 3 minutes cold.
COREDNS := $(CLUSTER_BIN)/coredns

.PHONY: coredns
coredns: $(COREDNS)

$(COREDNS): test/cluster/coredns/go.mod test/cluster/coredns/go.sum test/cluster/coredns/main.go hack/build-coredns.sh
	GO=$(GO) ./hack/build-coredns.sh $(CLUSTER_BIN)

# The upstream conformance suite at the control plane's version (e2e.test,
# the ginkgo CLI, the binaries of its images), from test/cluster's pins
# (see hack/build-conformance.sh); rebuilt only when they change. Its
# kubectl is the cluster's.
CONFORMANCE_BIN := $(OUT)/conformance/bin
CONFORMANCE_SUITE := $(addprefix $(CONFORMANCE_BIN)/,e2e.test ginkgo agnhost nnp busybox localhost.crt localhost.key)

.PHONY: conformance-suite conformance
conformance-suite: cluster $(CONFORMANCE_SUITE)

$(CONFORMANCE_SUITE) &: test/cluster/go.mod test/cluster/go.sum hack/build-conformance.sh hack/build-busybox.sh
	GO=$(GO) ./hack/build-conformance.sh $(CONFORMANCE_BIN)

# The upstream CSI sidecars that the CSI tests run beside their driver
# (see hack/build-csi.sh); rebuilt only when the script, which pins them,
# changes.
CSI_BIN := $(OUT)/csi/bin
CSI_SIDECARS := $(addprefix $(CSI_BIN)/,csi-provisioner csi-attacher)

.PHONY: csi-sidecars
csi-sidecars: $(CSI_SIDECARS)

$(CSI_SIDECARS) &: hack/build-csi.sh
	GO=$(GO) ./hack/build-csi.sh $(CSI_BIN)

# The node binary (./init) is init, cairn-agent and containerd in one,
# hard-linked under those names: it runs as the one it is called by.
# containerd and its shim are pinned in go.mod; the shim is built as
# upstream builds it, without gRPC.
CONTAINERD := github.com/containerd/containerd/v2
CONTAINERD_LDFLAGS = -X $(CONTAINERD)/version.Version=$(shell $(GO) list -m -f '{{.Version}}' $(CONTAINERD)) \
  -X $(CONTAINERD)/version.Package=$(CONTAINERD)

build: components
	$(GO) build $(GOFLAGS_NODE) -ldflags '$(LDFLAGS)' -o $(BIN)/cairn ./cmd/cairn
	$(GO) build $(GOFLAGS_NODE) -ldflags '$(LDFLAGS) $(CONTAINERD_LDFLAGS)' -o $(BIN)/init ./init
	ln -f $(BIN)/init $(BIN)/cairn-agent
	ln -f $(BIN)/init $(BIN)/containerd
	$(GO) build $(GOFLAGS_NODE) -tags no_grpc -ldflags '$(LDFLAGS) $(CONTAINERD_LDFLAGS)' -o $(BIN)/containerd-shim-runc-v2 $(CONTAINERD)/cmd/containerd-shim-runc-v2
	$(GO) build $(GOFLAGS_NODE) -ldflags '$(LDFLAGS)' -o $(BIN)/init-stage1 ./init/stage1
	$(GO) build $(GOFLAGS_NODE) -ldflags '$(LDFLAGS)' -o $(BIN)/pause ./rootfs/pause

$(OUT)/machine.yaml: | build
	$(BIN)/cairn config gen --out $(OUT)

image: deps build $(OUT)/machine.yaml
	$(BIN)/cairn image build -c $(OUT)/machine.yaml -o $(OUT)/node.raw

run: image
	$(BIN)/cairn qemu run --cairnconfig $(OUT)/cairnconfig $(OUT)/node.raw

# The control plane of test/cluster and the node's binaries are built
# first (cold: 10-25 min, warm: nothing to do), and the tests that use them
# must run, not skip.
# gotestsum runs go test and ends with a summary: how many tests ran,
# failed and skipped, and why each skipped (0 expected: CAIRN_NO_SKIP turns
# a missing prerequisite into a failure, see test/need).
GOTESTSUM_VERSION := v1.13.0
GOTESTSUM := $(OUT)/tools/gotestsum-$(GOTESTSUM_VERSION)

$(GOTESTSUM):
	GOBIN=$(abspath $(OUT)/tools) $(GO) install gotest.tools/gotestsum@$(GOTESTSUM_VERSION)
	mv $(OUT)/tools/gotestsum $@

TEST_ENV := CAIRN_NO_SKIP=1 CAIRN_CLUSTER_BIN=$(abspath $(CLUSTER_BIN)) CAIRN_BIN=$(abspath $(BIN)) \
  CAIRN_CONFORMANCE_BIN=$(abspath $(CONFORMANCE_BIN)) CAIRN_CSI_BIN=$(abspath $(CSI_BIN))

test: deps cluster build conformance-suite csi-sidecars $(GOTESTSUM)
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/e2e/
	$(GO) vet -tags 'e2e cluster' ./test/e2e/
	$(GO) vet -tags bench ./test/bench/
	$(GO) vet -tags conformance ./test/conformance/
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt: files above need formatting'; exit 1; }
	$(TEST_ENV) $(GOTESTSUM) --format pkgname-and-test-fails --raw-command -- \
	  sh -c '$(GO) test -json -timeout 20m ./... && CAIRN_POWERCUT_N=2 $(GO) test -json -tags e2e -timeout 45m -count=1 ./test/e2e/'

# Power cuts in QEMU: the VM killed at random points during a config apply
# and during an upgrade, CAIRN_POWERCUT_N times each (make test cuts 2 of
# each), the disk booted again after each; prints how many the node
# survived with the old or the new config and UKI whole. About 1.5 min a
# cut under TCG. CAIRN_POWERCUT_SEED=N replays a run's random points.
CAIRN_POWERCUT_N ?= 20
test-powercut: deps build
	$(TEST_ENV) CAIRN_POWERCUT_N=$(CAIRN_POWERCUT_N) $(GO) test -v -tags e2e -run '^TestPowerCut$$' -timeout 4h -count=1 ./test/e2e/

test-unit:
	$(GO) test ./...

# A cluster of two Cairn nodes in QEMU with a sample app, a Deployment
# behind a NodePort Service (hack/demo.sh, as root; a few minutes under
# TCG): prints how to reach it, and how to destroy the cluster.
demo: deps cluster coredns build
	./hack/demo.sh

# A cluster of two Cairn nodes in QEMU (cairn qemu cluster create, as root;
# about 15 min under TCG): pods across the nodes by IP, through a
# ClusterIP Service and through a NodePort, NetworkPolicy between them,
# then destroy (test/e2e TestCluster); and a cluster whose second node's
# QEMU dies while it boots, which create names while the first joins
# (TestClusterDegraded); and one node joining a control plane on the
# host's loopback with --kubeconfig (TestClusterExternal); and make demo's
# script, its app reached on both nodes (TestDemo).
test-cluster: deps cluster coredns build
	$(TEST_ENV) $(GO) test -v -tags 'e2e cluster' -run '^Test(Cluster(Degraded|External)?|Demo)$$' -timeout 60m -count=1 ./test/e2e/

bench: deps bench-pods bench-streams bench-storage bench-proxy bench-podnet bench-policy bench-cluster
	$(GO) test -tags e2e -run '^$$' -bench . -benchtime 1x -timeout 60m ./test/e2e/

# Image builds (test/e2e, about 5 min): cold (empty caches), warm (nothing
# changed), config-only (the hostname changed) and 100 configs at once
# (--configs), in seconds; the size of the UKI, initramfs, squashfs and
# each format; a table of where the UKI's bytes are; an install from the
# ISO under QEMU (the write, and QEMU start → the installed API).
bench-build: deps build
	$(TEST_ENV) $(GO) test -v -tags e2e -run '^$$' -bench ImageBuild -benchtime 1x -timeout 30m ./test/e2e/

# Pod startup latency, CPU time and memory of cairn-agent (the node binary
# run as the agent, the whole process) and of its kubelet part alone (podagent), with
# the raw CRI calls and the upstream kubelet on the same control plane and
# containerd (test/bench, as root; 5-10 min). CAIRN_BENCH_AGENT_PROFILE=FILE
# also writes a CPU profile of podagent.
bench-pods: cluster build
	$(TEST_ENV) $(GO) test -tags bench -run '^$$' -bench PodStartup -benchtime 1x -timeout 40m ./test/bench/

# kubectl exec round trip (p50, p99) and port-forward throughput through
# the API server to cairn-agent and to the upstream kubelet, both running
# at once on containerds of one build and sampled in turn, with the ratios
# and each node's CPU time (test/bench, as root; about 2 min).
bench-streams: cluster build
	$(TEST_ENV) $(GO) test -tags bench -run '^$$' -bench Streams -benchtime 1x -timeout 30m ./test/bench/

# Storage and pressure on a node on the host (agent/kubelet, as root;
# about 3 min): the CSI stage and publish latency (p50, p99) of 20 pods
# started at once, each with its own claim, and how long after a pod's
# deletion its volume is unmounted, on the test driver with the upstream
# provisioner and attacher; how long a pod that crosses memory.available
# takes to be evicted.
bench-storage: cluster build csi-sidecars
	$(TEST_ENV) $(GO) test -run '^$$' -bench 'CSI|Eviction' -benchtime 1x -timeout 20m ./agent/kubelet/

# The Service dataplane (as root; about an hour). First the table alone in
# a network namespace (agent/proxy): at 1 000, 10 000 and 50 000 Services
# of 5 endpoints, the time from the model to the kernel for an empty
# table, a restart over an unchanged table (which writes nothing) and one
# endpoint added. Then side by side with upstream kube-proxy in nftables
# mode (test/bench), each in a namespace of its own against one API
# server, twice each, at 10, 1 000 and 10 000 Services
# (CAIRN_BENCH_PROXY_SIZES to choose): start, restart, one endpoint, nine
# tenths of the size created live (9 000 at 10 000), CPU and memory,
# new-connection latency, with the ratios. "Programmed" is read back from
# the kernel each time its nftables generation moves.
bench-proxy: deps cluster build
	$(TEST_ENV) $(GO) test -run '^$$' -bench ProxyTable -benchtime 1x -timeout 20m ./agent/proxy/
	$(TEST_ENV) $(GO) test -tags bench -run '^$$' -bench '^BenchmarkProxy$$' -benchtime 1x -timeout 150m ./test/bench/

# Pod to pod over the pod routes (agent/podroutes): a one-byte TCP
# request and response between two pods on one node, and on two nodes
# through host-gw and through VXLAN, each a network namespace here.
bench-podnet: deps cluster
	$(TEST_ENV) $(GO) test -run '^$$' -bench PodToPod -benchtime 3s -timeout 10m ./agent/podroutes/

# cairn qemu cluster create with 3 nodes, from the command to every Node
# Ready and CoreDNS serving (test/e2e, as root; about 5 min under TCG).
bench-cluster: deps cluster coredns build
	$(TEST_ENV) $(GO) test -v -tags 'e2e cluster' -run '^$$' -bench ClusterCreate -benchtime 1x -timeout 30m ./test/e2e/

# NetworkPolicy (agent/proxy's PolicyEnforcer): 1 000 policies over 5 000
# pods programmed into a table from empty, again after a restart, and one
# policy changed and one pod added, each in one transaction.
bench-policy: deps
	$(TEST_ENV) $(GO) test -run '^$$' -bench PolicyTable -benchtime 1x -timeout 10m ./agent/proxy/

# The upstream suite's [sig-network] [Conformance] specs against a cluster
# of two Cairn nodes in QEMU (test/e2e TestClusterConformance, as root;
# the suite's images in the cluster's registry): a JUnit report in
# $(OUT)/conformance/cluster-report and the line "conformance: N passed, N
# failed, N skipped in Xm".
conformance-cluster: deps cluster coredns build conformance-suite
	$(TEST_ENV) $(GO) test -v -tags 'e2e cluster' -run '^TestClusterConformance$$' -timeout 180m -count=1 ./test/e2e/

# The upstream suite's [sig-node] specs of [NodeConformance] and
# [Conformance] against a Cairn node on the host (test/conformance, as
# root): a JUnit report in $(OUT)/conformance/report and the line
# "conformance: N passed, N failed, N skipped in Xm". Not in make test,
# which runs a few of them (TestSelection).
conformance: deps cluster build conformance-suite
	$(TEST_ENV) $(GO) test -v -tags conformance -run '^TestConformance$$' -timeout 100m -count=1 ./test/conformance/

proto:
	protoc -I api/machine -I /usr/include \
	  --go_out=api/machine --go_opt=paths=source_relative \
	  --go-grpc_out=api/machine --go-grpc_opt=paths=source_relative \
	  api/machine/machine.proto

clean:
	rm -rf $(OUT)
