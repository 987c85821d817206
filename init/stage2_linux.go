package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"time"

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

	mu       sync.Mutex
	timeline []record
	// disks are the filesystems on disk mounted by stage 2, unmounted in
	// reverse order at shutdown (memory filesystems need no unmount).
	disks []string

	shutdownOnce sync.Once
}

func stage2() error {
	n := &node{timeline: inheritTimeline()}
	n.reaper = supervisor.NewReaper()
	n.services = supervisor.New(n.reaper, slog.Default())
	// Ctrl-Alt-Del and ACPI-less requests arrive as signals to PID 1.
	unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT)

	steps := []step{
		{name: "mount system filesystems", run: mountSystem, fatal: true},
		{name: "load kernel modules", run: loadModules},
		{name: "enable cgroup controllers", run: enableControllers},
		{name: "mount STATE", run: n.mountState},
		{name: "load machine config", run: n.loadConfig},
		{name: "set hostname", run: n.setHostname},
		{name: "configure network", run: n.configureNetwork},
		{name: "serve control socket", run: n.serveControl},
		{name: "start services", run: n.startServices},
	}
	n.mu.Lock()
	err := runSteps(&n.timeline, steps)
	n.mu.Unlock()
	if err != nil {
		return err
	}
	slog.Info("boot done", "at", sinceBoot().Round(time.Millisecond))
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
	return mountAll([]mountSpec{
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "ptmxmode=0666,mode=0620"},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "nsdelegate"},
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
	if err := mountAll([]mountSpec{{dev, stateDir, "ext4", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""}}); err != nil {
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

func (n *node) startServices() error {
	if n.cfg == nil {
		return errNoConfig
	}
	return n.services.Start(supervisor.Service{
		Name:    "cairn-agent",
		Path:    agentPath,
		Args:    []string{"--config", configPath, "--init-socket", controlSock},
		Env:     []string{"PATH=/usr/bin:/sbin"},
		Restart: supervisor.RestartAlways,
		Output:  prefixWriter("cairn-agent: ", os.Stdout),
	})
}

// prefixWriter returns a writer that copies lines to w, each prefixed.
func prefixWriter(prefix string, w io.Writer) io.Writer {
	pr, pw := io.Pipe()
	go func() {
		buf := make([]byte, 0, 4096)
		chunk := make([]byte, 4096)
		for {
			k, err := pr.Read(chunk)
			buf = append(buf, chunk[:k]...)
			for {
				i := strings.IndexByte(string(buf), '\n')
				if i < 0 {
					break
				}
				io.WriteString(w, prefix+string(buf[:i+1]))
				buf = buf[i+1:]
			}
			if err != nil {
				return
			}
		}
	}()
	return pw
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
