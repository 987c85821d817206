#!/usr/bin/env bash
# Builds the upstream CSI sidecars that the CSI tests deploy beside their
# driver into OUTDIR: csi-provisioner (external-provisioner) and
# csi-attacher (external-attacher), at the versions pinned below. Their
# modules replace some of their dependencies, which `go install MOD@V`
# refuses, so each is downloaded and built as the main module, with its own
# go.sum. (node-driver-registrar and csi-driver-host-path are not served by
# the Go proxy here: test/images has a registrar and a driver for tests.)
set -euo pipefail

out=${1:?usage: build-csi.sh OUTDIR}
GO=${GO:-go}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-buildvcs=false
start=$(date +%s)

build() { # build MODULE@VERSION PACKAGE OUTPUT
	dir=$($GO mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[ -n "$dir" ] || { echo "build-csi: cannot download $1" >&2; exit 1; }
	(cd "$dir" && $GO build -mod=mod -trimpath -ldflags '-s -w -buildid=' -o "$3" "./$2")
}

build github.com/kubernetes-csi/external-provisioner/v6@v6.4.0 cmd/csi-provisioner "$out/csi-provisioner"
build github.com/kubernetes-csi/external-attacher/v4@v4.13.0 cmd/csi-attacher "$out/csi-attacher"

echo "build-csi: $(($(date +%s) - start)) s"
stat -c '%s %n' "$out/csi-provisioner" "$out/csi-attacher" | awk '{ printf "%-48s %5.1f MB\n", $2, $1/1e6 }'
