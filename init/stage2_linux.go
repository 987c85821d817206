package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/supervisor"
	"golang.org/x/sys/unix"
)

const (
	stateDir    = "/system/state"
	configPath  = stateDir + "/config.yaml"
	agentPath   = "/usr/bin/cairn-agent"
	controlSock = "/run/cairn/init.sock"
)

// node is what stage 2 sets up and later tears down.
type node struct {
	reaper   *supervisor.Reaper
	services *supervisor.Supervisor
	cfg      *machineconfig.Config
	// varErr is why EPHEMERAL is not mounted on /var, if it is not.
	varErr error
	// images maps image-backed services to their image.
	images map[string]string

	mu       sync.Mutex
	timeline []boot.Record
	// disks are the filesystems on disk mounted by stage 2, unmounted in
	// reverse order at shutdown (memory filesystems need no unmount).
	disks []string

	shutdownOnce sync.Once
}

func stage2() error {
	n := &node{timeline: boot.InheritTimeline()}
	n.reaper = supervisor.NewReaper()
	// Ctrl-Alt-Del and ACPI-less requests arrive as signals to PID 1.
	unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT)

	steps := []boot.Step{
		{Name: "mount system filesystems", Run: mountSystem, Fatal: true},
		{Name: "load kernel modules", Run: boot.LoadModules},
		{Name: "enable cgroup controllers", Run: enableControllers},
		{Name: "prepare EPHEMERAL", Run: func() error { n.varErr = n.prepareEphemeral(); return n.varErr }},
		{Name: "mount STATE", Run: n.mountState},
		{Name: "load machine config", Run: n.loadConfig},
		{Name: "set hostname", Run: n.setHostname},
		{Name: "configure network", Run: n.configureNetwork},
		{Name: "serve control socket", Run: n.serveControl},
		{Name: "start services", Run: n.startServices},
	}
	n.mu.Lock()
	err := boot.RunSteps(&n.timeline, steps)
	n.mu.Unlock()
	if err != nil {
		return err
	}
	slog.Info("boot done", "at", boot.SinceBoot().Round(time.Millisecond))
	for sig := range sigs {
		cmd := unix.LINUX_REBOOT_CMD_POWER_OFF
		if sig == unix.SIGINT {
			cmd = unix.LINUX_REBOOT_CMD_RESTART
		}
		go n.shutdown(cmd)
	}
	return nil
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
	if err := boot.MountAll([]boot.Mount{{Source: dev, Target: stateDir, FSType: "ext4", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Data: ""}}); err != nil {
		return err
	}
	n.disks = append(n.disks, stateDir)
	return nil
}

func (n *node) loadConfig() error {
	cfg, err := machineconfig.Load(configPath)
	if err != nil {
		return err
	}
	n.cfg = cfg
	return nil
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
// from it.
func (n *node) shutdown(cmd int) {
	n.shutdownOnce.Do(func() {
		what := "power off"
		if cmd == unix.LINUX_REBOOT_CMD_RESTART {
			what = "reboot"
		}
		slog.Info("shutting down", "then", what)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := n.services.Stop(ctx); err != nil {
			slog.Warn("services did not stop in time", "err", err)
		}
		cancel()
		unix.Kill(-1, unix.SIGTERM)
		time.Sleep(time.Second)
		unix.Kill(-1, unix.SIGKILL)
		unix.Sync()
		for i := len(n.disks) - 1; i >= 0; i-- {
			unmountBelow(n.disks[i])
			if err := unix.Unmount(n.disks[i], 0); err != nil {
				slog.Warn("unmount failed, detaching", "path", n.disks[i], "err", err)
				unix.Unmount(n.disks[i], unix.MNT_DETACH)
			}
		}
		unix.Sync()
		slog.Info("bye", "then", what)
		for {
			if err := unix.Reboot(cmd); err != nil {
				slog.Error("reboot syscall failed", "err", err)
			}
			time.Sleep(time.Second)
		}
	})
}

// unmountBelow unmounts what is mounted below dir (container root
// filesystems, say), deepest first, so dir itself can be unmounted.
func unmountBelow(dir string) {
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
		if err := unix.Unmount(below[i], 0); err != nil {
			unix.Unmount(below[i], unix.MNT_DETACH)
		}
	}
}
