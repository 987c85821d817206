#!/usr/bin/env bash
# Builds the upstream conformance suite at the control plane's version from
# the module in test/cluster into OUTDIR: e2e.test (go test -c
# k8s.io/kubernetes/test/e2e), the ginkgo CLI that runs it in parallel
# processes, and what test/conformance makes
# images of: agnhost, the specs' test server, with its test certificate
# (localhost.crt, .key), nnp (the nonewprivs image's), and busybox
# (build-busybox.sh). Versions come from test/cluster/go.mod;
# test/conformance runs them.
#
# GOFLAGS=-p=2 by default, as in build-cluster.sh; set CLUSTER_GOFLAGS to
# change it. The specs that run kubectl use build-cluster.sh's.
set -euo pipefail

out=${1:?usage: build-conformance.sh OUTDIR}
GO=${GO:-go}
mkdir -p "$out"
out=$(cd "$out" && pwd)
"$(dirname "$0")/build-busybox.sh" "$out"
cd "$(dirname "$0")/../test/cluster"
export GOWORK=off CGO_ENABLED=0 # the module stands alone, whatever go.work says
export GOFLAGS="${CLUSTER_GOFLAGS:--p=2} -buildvcs=false"

start=$(date +%s)

# The same version stamps as build-cluster.sh: the suite compares its
# version with the server's.
. ../../hack/lib/kube-version.sh
ldflags="-s -w -buildid= $(kube_version_ldflags)"

$GO build -trimpath -ldflags "$ldflags" -o "$out/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
$GO build -trimpath -ldflags "$ldflags" -o "$out/agnhost" k8s.io/kubernetes/test/images/agnhost
$GO build -trimpath -ldflags "$ldflags" -o "$out/nnp" k8s.io/kubernetes/test/images/nonewprivs
# agnhost's image has porter's test certificate at /, for the specs' https.
src=$($GO list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost/porter
install -m 0644 "$src/localhost.crt" "$src/localhost.key" "$out/"
$GO test -c -trimpath -ldflags "$ldflags" -o "$out/e2e.test" k8s.io/kubernetes/test/e2e
touch "$out/e2e.test" "$out/ginkgo" "$out/agnhost" "$out/nnp" "$out/busybox" # the make rule's targets are all newer than its inputs

echo "build-conformance: $(($(date +%s) - start)) s"
stat -c '%s %n' "$out/e2e.test" "$out/ginkgo" "$out/agnhost" "$out/nnp" "$out/busybox" |
	awk '{ printf "%-48s %5.1f MB\n", $2, $1/1e6 }'
