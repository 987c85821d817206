#!/usr/bin/env bash
# Builds the upstream conformance suite at the control plane's version from
# the module in test/cluster into OUTDIR: e2e.test (go test -c
# k8s.io/kubernetes/test/e2e), the ginkgo CLI that runs it in parallel
# processes, kubectl, which some specs run, and what test/conformance makes
# images of: agnhost, the specs' test server, with its test certificate
# (localhost.crt, .key), and nnp (the nonewprivs image's). Versions come from
# test/cluster/go.mod; test/conformance runs them.
#
# GOFLAGS=-p=2 by default, as in build-cluster.sh; set CLUSTER_GOFLAGS to
# change it. KUBECTL=PATH writes kubectl there instead of OUTDIR (make
# conformance puts it beside the control plane, in _out/cluster/bin).
set -euo pipefail

out=${1:?usage: build-conformance.sh OUTDIR}
GO=${GO:-go}
mkdir -p "$out"
out=$(cd "$out" && pwd)
kubectl=${KUBECTL:-$out/kubectl}
mkdir -p "$(dirname "$kubectl")"
kubectl=$(cd "$(dirname "$kubectl")" && pwd)/$(basename "$kubectl")
cd "$(dirname "$0")/../test/cluster"
export GOWORK=off CGO_ENABLED=0 # the module stands alone, whatever go.work says
export GOFLAGS="${CLUSTER_GOFLAGS:--p=2} -buildvcs=false"

start=$(date +%s)

# The same version stamps as build-cluster.sh: the suite compares its
# version with the server's, and kubectl's with the server's.
v=$($GO list -m -f '{{.Version}}' k8s.io/kubernetes)
major=${v#v}
major=${major%%.*}
minor=${v#v*.}
minor=${minor%%.*}
x=''
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	x+=" -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor"
	x+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
ldflags="-s -w -buildid= $x"

$GO build -trimpath -ldflags "$ldflags" -o "$out/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
$GO build -trimpath -ldflags "$ldflags" -o "$kubectl" k8s.io/kubernetes/cmd/kubectl
$GO build -trimpath -ldflags "$ldflags" -o "$out/agnhost" k8s.io/kubernetes/test/images/agnhost
$GO build -trimpath -ldflags "$ldflags" -o "$out/nnp" k8s.io/kubernetes/test/images/nonewprivs
# agnhost's image has porter's test certificate at /, for the specs' https.
src=$($GO list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost/porter
install -m 0644 "$src/localhost.crt" "$src/localhost.key" "$out/"
$GO test -c -trimpath -ldflags "$ldflags" -o "$out/e2e.test" k8s.io/kubernetes/test/e2e
touch "$out/e2e.test" "$out/ginkgo" "$kubectl" "$out/agnhost" "$out/nnp" # the make rule's targets are all newer than its inputs

echo "build-conformance: $(($(date +%s) - start)) s"
stat -c '%s %n' "$out/e2e.test" "$out/ginkgo" "$out/agnhost" "$out/nnp" "$kubectl" |
	awk '{ printf "%-48s %5.1f MB\n", $2, $1/1e6 }'
