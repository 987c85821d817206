// Command stage1 is /init in a Cairn initramfs, PID 1 for its first second:
// it mounts /dev /proc /sys, loads the boot modules, mounts the root
// squashfs read-only with /etc as a tmpfs overlay, switches into it and
// execs the real init there, handing over its boot timeline. It is kept
// apart from init so the initramfs stays small.
package main

import "github.com/cairn-os/cairn/init/internal/boot"

func main() { boot.Main("stage1", stage1) }
