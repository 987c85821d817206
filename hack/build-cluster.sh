#!/usr/bin/env bash
# Builds the control plane that tests run against from the module in
# test/cluster into OUTDIR: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and kube-proxy (upstream's, benchmark
# references), etcd, and kubectl (the client that tests of the kubelet
# server run).
# Static (no cgo) and without paths. Versions come from test/cluster/go.mod;
# bump them there and nowhere else.
#
# A cold build takes 10-25 minutes on 2 cores and links kube-apiserver in
# about 3 GB of memory; GOFLAGS=-p=2 (the default here) keeps the compile
# from going past that. Set CLUSTER_GOFLAGS to change it.
set -euo pipefail

out=${1:?usage: build-cluster.sh OUTDIR}
GO=${GO:-go}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../test/cluster"
export GOWORK=off CGO_ENABLED=0 # the module stands alone, whatever go.work says
export GOFLAGS="${CLUSTER_GOFLAGS:--p=2} -buildvcs=false"

build() { # build LDFLAGS OUTPUT PACKAGE...
	local ldflags=$1 o=$2
	shift 2
	$GO build -trimpath -ldflags "-s -w -buildid= $ldflags" -o "$o" "$@"
}

start=$(date +%s)

# etcd: its version is a constant in go.etcd.io/etcd/api/v3/version.
build '' "$out/etcd" go.etcd.io/etcd/server/v3

# Kubernetes: one go build for all six, so shared packages compile once.
. ../../hack/lib/kube-version.sh
build "$(kube_version_ldflags)" "$out/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-scheduler \
	k8s.io/kubernetes/cmd/kubelet \
	k8s.io/kubernetes/cmd/kube-proxy \
	k8s.io/kubernetes/cmd/kubectl
touch "$out/etcd" # the make rule's targets are all newer than its inputs

echo "build-cluster: $(($(date +%s) - start)) s"
cd "$out"
stat -c '%s %n' kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl etcd |
	awk '{ n += $1; printf "%-24s %5.1f MB\n", $2, $1/1e6 } END { printf "%-24s %5.1f MB\n", "total", n/1e6 }'
