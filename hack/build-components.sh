#!/usr/bin/env bash
# Builds the node's components from the module in rootfs/components into
# OUTDIR: runc, and the CNI plugins in OUTDIR/cni (containerd and its shim
# come from the main module: make build). Every binary is static and
# reproducible: no paths, no VCS stamp, no build IDs. Versions come from rootfs/components/go.mod; bump
# them there (go get -tool MODULE/PKG@VERSION) and nowhere else.
set -euo pipefail

out=${1:?usage: build-components.sh OUTDIR}
GO=${GO:-go}
mkdir -p "$out/cni"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../rootfs/components"
export GOWORK=off # the module stands alone, whatever go.work says

runc=github.com/opencontainers/runc
cni=github.com/containernetworking/plugins
version() { $GO list -m -f '{{.Version}}' "$1"; }

build() { # build LDFLAGS OUTPUT PACKAGE: pure Go
	CGO_ENABLED=0 $GO build -trimpath -buildvcs=false -ldflags "-s -w -buildid= $1" -o "$2" "$3"
}

# runc needs cgo for nsenter and libseccomp (Debian: libseccomp-dev), linked
# as a static PIE like upstream's release; without the libpathrs tag (a Rust
# library Debian 12 lacks) it uses the pure-Go pathrs-lite. -B none stops
# the external linker's default GNU build ID; its bytes also depend on the
# host's gcc, glibc and libseccomp, which it links in.
v=$(version $runc)
case $($($GO env CC) -print-file-name=libseccomp.a) in
/*) ;;
*) echo 'build-components: libseccomp.a not found: run make deps (Debian: libseccomp-dev)' >&2; exit 1 ;;
esac
CGO_ENABLED=1 $GO build -trimpath -buildvcs=false -buildmode=pie \
	-tags 'seccomp urfave_cli_no_docs netgo osusergo' \
	-ldflags "-s -w -buildid= -B none -X main.version=${v#v} -linkmode external -extldflags -static-pie" \
	-o "$out/runc" $runc

# CNI plugins: pure Go.
v=$(version $cni)
for p in main/bridge ipam/host-local main/loopback meta/portmap; do
	build "-X $cni/pkg/utils/buildversion.BuildVersion=$v" "$out/cni/${p#*/}" $cni/plugins/$p
done

cd "$out"
stat -c '%s %n' runc cni/bridge cni/host-local cni/loopback cni/portmap |
	awk '{ n += $1; printf "%-26s %5.1f MB\n", $2, $1/1e6 } END { printf "%-26s %5.1f MB\n", "total", n/1e6 }'
