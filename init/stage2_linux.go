package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/supervisor"
)

// node is what stage 2 sets up and later tears down.
type node struct {
	reaper   *supervisor.Reaper
	services *supervisor.Supervisor
	// cfg is the machine config the node runs on: STATE's, or in recovery
	// mode what could be recovered from it.
	cfg *machineconfig.Config
	// loadErr is why STATE's machine config did not load and recovery
	// what the node runs on instead; both nil when it loaded.
	loadErr  error
	recovery *machineconfig.Recovery
	// varErr is why EPHEMERAL is not mounted on /var, if it is not.
	varErr error
	// images maps image-backed services to their image.
	images map[string]string

	// mu is held while a boot step runs, so the control socket and
	// shutdown see the node between steps.
	mu       sync.Mutex
	timeline []boot.Record
	// disks are the filesystems on disk mounted by stage 2, unmounted in
	// reverse order at shutdown (memory filesystems need no unmount).
	disks []string
	// stopping is set when shutdown begins: no boot step starts after.
	stopping atomic.Bool

	shutdownOnce sync.Once
	// sys is what shutdown does to the machine; tests replace it.
	sys system
}

// system is the machine as shutdown acts on it.
type system struct {
	killAll func(unix.Signal) // every process but PID 1
	unmount func(path string, flags int) error
	sync    func()
	reboot  func(cmd int) error
}

var realSystem = system{
	killAll: func(sig unix.Signal) { unix.Kill(-1, sig) },
	unmount: unix.Unmount,
	sync:    unix.Sync,
	reboot:  unix.Reboot,
}

// shutdownWait bounds how long shutdown waits for a boot step that is
// running (an fsck, a DHCP exchange) before it goes on regardless.
const shutdownWait = 90 * time.Second

func stage2() error {
	n := &node{timeline: boot.InheritTimeline(), sys: realSystem}
	n.reaper = supervisor.NewReaper()
	// Ctrl-Alt-Del arrives as SIGINT to PID 1; SIGTERM asks for a power
	// off. Both are heard from now on, during the boot too.
	unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT)

	booted := make(chan error, 1)
	go func() { booted <- boot.Catch("boot", func() error { return n.boot(n.steps()) }) }()
	for {
		select {
		case err := <-booted:
			if err != nil {
				return err // fatal: boot.Main logs it and reboots
			}
		case sig := <-sigs:
			cmd := unix.LINUX_REBOOT_CMD_POWER_OFF
			if sig == unix.SIGINT {
				cmd = unix.LINUX_REBOOT_CMD_RESTART
			}
			n.requestShutdown(cmd, "signal "+sig.String())
		}
	}
}

// steps is stage 2's boot, in order.
func (n *node) steps() []boot.Step {
	return []boot.Step{
		{Name: "mount system filesystems", Run: mountSystem, Fatal: true},
		{Name: "load kernel modules", Run: boot.LoadModules},
		{Name: "listen for the power button", Run: n.listenPowerButton},
		{Name: "enable cgroup controllers", Run: enableControllers},
		{Name: "prepare EPHEMERAL", Run: func() error { n.varErr = n.prepareEphemeral(); return n.varErr }},
		{Name: "mount STATE", Run: n.mountState},
		{Name: "load machine config", Run: n.loadConfig},
		{Name: "set hostname", Run: n.setHostname},
		{Name: "configure network", Run: n.configureNetwork},
		{Name: "serve control socket", Run: n.serveControl},
		{Name: "start services", Run: n.startNodeServices},
	}
}

// boot runs the steps one at a time, each under mu, until a fatal error
// (returned) or a shutdown (the boot stops before the next step).
func (n *node) boot(steps []boot.Step) error {
	for _, s := range steps {
		n.mu.Lock()
		if n.stopping.Load() {
			n.mu.Unlock()
			slog.Info("boot stopped: the node is shutting down", "before", s.Name)
			return nil
		}
		err := boot.RunSteps(&n.timeline, []boot.Step{s})
		n.mu.Unlock()
		if err != nil {
			return err
		}
	}
	slog.Info("boot done", "at", boot.SinceBoot().Round(time.Millisecond))
	return nil
}

// requestShutdown starts the shutdown (once; later requests are no-ops)
// in a goroutine of its own, so the caller — a signal, the power button,
// the control socket — returns at once.
func (n *node) requestShutdown(cmd int, by string) {
	slog.Info("shutdown requested", "by", by, "then", shutdownWhat(cmd))
	boot.Go("shutdown", func() { n.shutdown(cmd) })
}

func shutdownWhat(cmd int) string {
	if cmd == unix.LINUX_REBOOT_CMD_RESTART {
		return "reboot"
	}
	return "power off"
}

// listenPowerButton powers the node off when the ACPI power button is
// pressed.
func (n *node) listenPowerButton() error {
	return listenPowerButton(func(ev acpiEvent) {
		n.requestShutdown(unix.LINUX_REBOOT_CMD_POWER_OFF, "ACPI power button "+ev.BusID)
	})
}

func mountSystem() error {
	// Tools such as resize2fs look for mounts in /etc/mtab.
	if err := os.Symlink("/proc/self/mounts", "/etc/mtab"); err != nil && !os.IsExist(err) {
		return err
	}
	return boot.MountAll([]boot.Mount{
		{Source: "tmpfs", Target: "/run", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=0755"},
		{Source: "tmpfs", Target: "/tmp", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"},
		{Source: "devpts", Target: "/dev/pts", FSType: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "ptmxmode=0666,mode=0620"},
		{Source: "tmpfs", Target: "/dev/shm", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"},
		{Source: "cgroup2", Target: "/sys/fs/cgroup", FSType: "cgroup2", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Data: "nsdelegate"},
	})
}

// enableControllers delegates every available cgroup v2 controller to the
// children of the root cgroup, where services and pods are placed.
func enableControllers() error {
	raw, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		return err
	}
	var enable []string
	for _, c := range strings.Fields(string(raw)) {
		enable = append(enable, "+"+c)
	}
	if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte(strings.Join(enable, " ")), 0o644); err != nil {
		return fmt.Errorf("enable controllers %v: %w", enable, err)
	}
	return nil
}

// findPartition returns the /dev path of the partition whose GPT label is
// label, waiting up to timeout for the disk driver to announce it.
func findPartition(label string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		uevents, _ := filepath.Glob("/sys/class/block/*/uevent")
		for _, u := range uevents {
			raw, err := os.ReadFile(u)
			if err != nil {
				continue
			}
			var name, dev string
			for _, line := range strings.Split(string(raw), "\n") {
				k, v, _ := strings.Cut(line, "=")
				switch k {
				case "PARTNAME":
					name = v
				case "DEVNAME":
					dev = v
				}
			}
			if name == label && dev != "" {
				return "/dev/" + dev, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no partition labelled %s after %s", label, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (n *node) mountState() error {
	dev, err := findPartition("STATE", 10*time.Second)
	if err != nil {
		return err
	}
	if err := boot.MountAll([]boot.Mount{{Source: dev, Target: layout.StateDir, FSType: "ext4", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Data: ""}}); err != nil {
		return err
	}
	n.disks = append(n.disks, layout.StateDir)
	return nil
}

// loadConfig loads STATE's machine config. When it cannot, the node runs
// in recovery mode on what machineconfig.Recover salvages from the file
// (hostname, network, API credentials, else defaults): the network comes
// up, and the management API answers if its credentials were salvaged, so
// that the operator can see why; nothing else the config asks for runs.
func (n *node) loadConfig() error {
	cfg, err := machineconfig.Load(layout.MachineConfig)
	if err == nil {
		n.cfg = cfg
		return nil
	}
	rec, _ := machineconfig.RecoverFile(layout.MachineConfig) // its read error is err's
	n.cfg, n.loadErr, n.recovery = rec.Config, err, rec
	slog.Error("the machine config cannot be loaded", "path", layout.MachineConfig, "err", err)
	slog.Warn(rec.String())
	slog.Warn("the node runs no system services and no kubelet until its machine config loads: " + recoveryAdvice)
	return fmt.Errorf("%w; %s", err, rec)
}

// recoveryAdvice is what an operator does about a config that does not load.
const recoveryAdvice = "check the file with `cairn config validate FILE`, put a valid machine config at config.yaml on the STATE partition, then reboot"

// startNodeServices starts the services, unless in recovery mode without
// API credentials: then no management API can be served, and nothing the
// config asked for runs either.
func (n *node) startNodeServices() error {
	if n.recovery != nil && !n.recovery.API {
		slog.Warn("no management API: the machine config holds no usable machine.api credentials; the node answers on its network only (DHCP, ping)")
		return fmt.Errorf("none started in recovery mode: no usable machine.api credentials, so no management API; %s", recoveryAdvice)
	}
	return n.startServices()
}

var errNoConfig = errors.New("no machine config loaded")

func (n *node) setHostname() error {
	if n.cfg == nil {
		return errNoConfig
	}
	name := n.cfg.Machine.Hostname
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("sethostname %q: %w", name, err)
	}
	hosts := fmt.Sprintf("127.0.0.1 localhost\n::1 localhost\n127.0.1.1 %s\n", name)
	return errors.Join(
		os.WriteFile("/etc/hostname", []byte(name+"\n"), 0o644),
		os.WriteFile("/etc/hosts", []byte(hosts), 0o644),
	)
}

// shutdown stops services in reverse order, ends every other process, syncs,
// unmounts and powers off or reboots. It runs once; PID 1 never returns
// from it. Whatever is missing (no supervisor after a boot that went
// wrong) or fails on the way, even a panic, the node still goes down.
func (n *node) shutdown(cmd int) {
	n.shutdownOnce.Do(func() {
		what := shutdownWhat(cmd)
		slog.Info("shutting down", "then", what)
		sup, disks, ok := n.stopBoot(shutdownWait)
		if sup != nil {
			boot.Catch("stop services", func() error {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := sup.Stop(ctx); err != nil {
					slog.Warn("services did not stop in time", "err", err)
				}
				return nil
			})
		}
		boot.Catch("end processes", func() error {
			n.sys.killAll(unix.SIGTERM)
			time.Sleep(time.Second)
			n.sys.killAll(unix.SIGKILL)
			return nil
		})
		boot.Catch("unmount", func() error {
			n.sys.sync()
			if !ok {
				// A boot step still holds the node: unmount what stage 2
				// mounts on disk, by name, in the reverse order of the boot.
				disks = []string{varDir, layout.StateDir}
			}
			for i := len(disks) - 1; i >= 0; i-- {
				n.unmountBelow(disks[i])
				if err := n.sys.unmount(disks[i], 0); err != nil && !errors.Is(err, unix.EINVAL) {
					slog.Warn("unmount failed, detaching", "path", disks[i], "err", err)
					n.sys.unmount(disks[i], unix.MNT_DETACH)
				}
			}
			n.sys.sync()
			return nil
		})
		slog.Info("bye", "then", what)
		for {
			if err := boot.Catch("reboot", func() error { return n.sys.reboot(cmd) }); err != nil {
				slog.Error("reboot syscall failed", "err", err)
			}
			time.Sleep(time.Second)
		}
	})
}

// stopBoot marks the node as stopping, so no boot step starts any more,
// and returns the supervisor (nil if there is none) and the disks mounted.
// It waits up to wait for a boot step that is running; ok is false if that
// step did not end in time, and then sup and disks are not known.
func (n *node) stopBoot(wait time.Duration) (sup *supervisor.Supervisor, disks []string, ok bool) {
	n.stopping.Store(true)
	deadline := time.Now().Add(wait)
	for !n.mu.TryLock() {
		if time.Now().After(deadline) {
			slog.Warn("a boot step is still running: shutting down without stopping the services in order", "waited", wait)
			return nil, nil, false
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer n.mu.Unlock()
	return n.services, slices.Clone(n.disks), true
}

// unmountBelow unmounts what is mounted below dir (container root
// filesystems, say), deepest first, so dir itself can be unmounted.
func (n *node) unmountBelow(dir string) {
	raw, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return
	}
	var below []string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			below = append(below, f[1])
		}
	}
	for i := len(below) - 1; i >= 0; i-- {
		if err := n.sys.unmount(below[i], 0); err != nil {
			n.sys.unmount(below[i], unix.MNT_DETACH)
		}
	}
}
