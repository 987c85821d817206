#!/usr/bin/env bash
# Installs the Debian packages Cairn's build and tests need, only those
# missing. Run as root (or with sudo) on Debian 12.
set -euo pipefail
pkgs=(
  qemu-system-x86 qemu-utils ovmf      # boot images
  systemd-boot-efi                     # UKI stub and systemd-boot
  squashfs-tools cpio kmod dpkg        # root filesystem, modules.dep
  dosfstools mtools gdisk e2fsprogs    # ESP, GPT checks, STATE
  nftables                             # nft: in the image, and for the CNI tests
  busybox-static bash-static curl      # the test images: busybox, agnhost's shells and curl
  netcat-openbsd                       # agnhost's nc, as upstream's image has it (the Service specs run nc -v -t / -u)
  bind9-dnsutils                       # dig, for the DNS specs' queriers (agnhost, glibc-dns-testing), as upstream's images have it
  make patch bzip2 xz-utils            # hack/build-busybox.sh: the conformance images' busybox from Debian's source
  iproute2                             # ip netns, veth: the network tests
  chrony                               # chronyd -x: a real NTP server on loopback for init's time keeper tests
  binutils ca-certificates             # objdump in tests, CA bundle
  xorriso                              # the iso format, iso9660 NoCloud volumes in the tests
  efitools sbsigntool                  # Secure Boot: signed key enrollment files; sbsign/sbverify check Cairn's signatures in the tests
  libseccomp-dev gcc libc6-dev pkg-config  # runc: cgo, static, with seccomp
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}"
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
