#!/usr/bin/env bash
# Builds CoreDNS, with the plugins a cluster's DNS needs, from the module in
# test/cluster/coredns into OUTDIR/coredns: cairn qemu cluster deploys it.
# Static (no cgo) and without paths; the version comes from
# test/cluster/coredns/go.mod (and coreDNSTag in qemu/cluster).
set -euo pipefail

out=${1:?usage: build-coredns.sh OUTDIR}
GO=${GO:-go}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../test/cluster/coredns"
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-buildvcs=false

start=$(date +%s)
$GO build -trimpath -ldflags '-s -w -buildid=' -o "$out/coredns" .
echo "build-coredns: $(($(date +%s) - start)) s, $(stat -c %s "$out/coredns" | awk '{ printf "%.1f MB", $1/1e6 }')"
