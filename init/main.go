// Command init is PID 1 of a Cairn node in its real root (stage 2; stage 1
// is init/stage1, in the initramfs). It mounts the system, prepares
// EPHEMERAL, loads the machine config from STATE, sets the hostname and
// network, and supervises containerd, the agent and the config's system
// services; then it reaps orphans and serves the control socket until asked
// to power off or reboot. It never exits: a fatal error is logged and the
// node reboots.
package main

import "github.com/cairn-os/cairn/init/internal/boot"

func main() { boot.Main("init", stage2) }
