// Package stage2 is init in a Cairn node's real root, PID 1 after stage 1
// (init/stage1, in the initramfs) switched into it; the node binary
// (init/main.go) runs Main when called as /sbin/init. It mounts the
// system, prepares EPHEMERAL, loads the machine config from STATE, sets
// the hostname and network, and supervises containerd, the agent and the
// config's system services; then it reaps orphans and serves the control
// socket until asked to power off or reboot. It never returns: a fatal
// error is logged and the node reboots.
package stage2

import "github.com/cairn-os/cairn/init/internal/boot"

// Main runs init; it must be PID 1 of a Cairn node.
func Main() { boot.Main("init", stage2) }
