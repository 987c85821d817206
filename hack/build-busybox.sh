#!/usr/bin/env bash
# Builds busybox for the conformance images (test/conformance) into
# OUTDIR/busybox: Debian 12's source package, fetched from Debian's archive
# and checked against pinned digests, built static with Debian's own static
# config and its patches but two. Those two (revert-9c143ce…,
# temp-deb-installer-hack) make ash drop environment variables whose names
# are not shell names, such as the "data-1" of a ConfigMap's envFrom, which
# upstream's busybox, and so upstream's busybox image, keeps: Debian's
# busybox-static fails the envFrom specs for it. Its shell looks commands
# up in PATH rather than running its applets first.
set -euo pipefail

out=${1:?usage: build-busybox.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)

version=1.35.0
revision=4+deb12u1
pool=http://deb.debian.org/debian/pool/main/b/busybox
files=(
  "busybox_${version}.orig.tar.bz2 faeeb244c35a348a334f4a59e44626ee870fb07b6884d68c10ae8bc19f83a694"
  "busybox_${version}-${revision}.debian.tar.xz 1cacbe095ef4880ea7879933c8e3c5075d1527cd6fbcb626a9b41e5daefd1a46"
)
dropped=(revert-9c143ce52da11ec3d21a3491c3749841d3dc10f0.patch temp-deb-installer-hack.patch)

# The same cache as the kernel package's (rootfs.DefaultCacheDir).
src=${CAIRN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn}/busybox
mkdir -p "$src"
for f in "${files[@]}"; do
  set -- $f
  if ! echo "$2  $src/$1" | sha256sum -c --quiet - 2>/dev/null; then
    echo "build-busybox: fetching $pool/$1"
    curl -fsSL --retry 3 -o "$src/$1.part" "$pool/$1"
    echo "$2  $src/$1.part" | sha256sum -c --quiet - || { echo "build-busybox: $1: digest mismatch" >&2; exit 1; }
    mv "$src/$1.part" "$src/$1"
  fi
done

start=$(date +%s)
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
tar -xjf "$src/busybox_${version}.orig.tar.bz2" -C "$build" --strip-components=1
tar -xJf "$src/busybox_${version}-${revision}.debian.tar.xz" -C "$build"
cd "$build"
grep -v '^#' debian/patches/series | while read -r p; do
  [ -n "$p" ] || continue
  for d in "${dropped[@]}"; do [ "$p" = "$d" ] && continue 2; done
  patch -p1 -s <"debian/patches/$p"
done
# Without the installer hack's patch, its option is gone from the config.
# The shell runs the programs of PATH, as upstream's busybox image does,
# not its own applets first (Debian's static busybox does): agnhost's
# image puts OpenBSD's nc before busybox's.
grep -v -e FEATURE_DI_ENV_HACK -e FEATURE_PREFER_APPLETS -e FEATURE_SH_STANDALONE debian/config/pkg/static >.config
printf '# CONFIG_FEATURE_PREFER_APPLETS is not set\n# CONFIG_FEATURE_SH_STANDALONE is not set\n' >>.config
export SOURCE_DATE_EPOCH=0 KCONFIG_NOTIMESTAMP=1
(yes '' || true) | make -s oldconfig >/dev/null
make -s -j"$(nproc)" busybox >build.log 2>&1 || { tail -30 build.log >&2; exit 1; }
install -m 0755 busybox "$out/busybox"
echo "build-busybox: busybox $version-$revision (Debian's, ash keeping every environment variable) in $(($(date +%s) - start)) s"
