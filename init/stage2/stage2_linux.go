package stage2

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
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/internal/containerdconfig"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/internal/version"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/supervisor"
)

// node is PID 1 of the node in its real root: what the boot sets up, the
// control socket reads, and the shutdown tears down.
type node struct {
	reaper   *supervisor.Reaper
	timeline *boot.Timeline
	// sys is what shutdown does to the machine; tests replace it.
	sys system

	// stop is closed when the shutdown begins: no boot step starts after.
	stop         chan struct{}
	shutdownOnce sync.Once

	// mu guards what the boot hands to the control socket and the
	// shutdown, below. It is held to read or set them, never across a step.
	mu sync.Mutex
	// booted is closed once the boot sequence has ended; nil before.
	booted   chan struct{}
	services *supervisor.Supervisor
	// loadErr is why STATE's machine config did not load, nil if it did.
	loadErr error
	// images maps image-backed services to their image.
	images map[string]string
	// disks are the filesystems on disk mounted by stage 2, unmounted in
	// reverse order at shutdown (memory filesystems need no unmount).
	disks []string
	// timeKeeper keeps the clock in step with machine.time.servers; nil
	// when none are configured.
	timeKeeper *timeKeeper
	// configs is the machine config as the node runs it and as STATE
	// holds it; nil until it is loaded.
	configs *configs
	// boots are the UKIs on the ESP: upgrades, blessing, rollbacks; nil
	// outside a node.
	boots *boots
	// resetting is the wipe the shutdown does, set by a reset; nil for
	// a plain shutdown.
	resetting *resetPlan
	// events is what happened on the node, for the Events call.
	events *eventLog
	// shutdownMarker is where the shutdown tells the agent; empty
	// outside a node.
	shutdownMarker string
}

func newNode(sys system, timeline []boot.Record) *node {
	n := &node{timeline: boot.NewTimeline(timeline), sys: sys, stop: make(chan struct{}), events: &eventLog{}}
	for _, r := range timeline { // stage 1's
		n.events.step(r)
	}
	n.timeline.Observe(n.events.step)
	return n
}

// system is the machine as shutdown acts on it.
type system struct {
	killAll func(unix.Signal) // every process but PID 1
	// childless is closed once PID 1 has no child left.
	childless func() <-chan struct{}
	unmount   func(path string, flags int) error
	sync      func()
	reboot    func(cmd int) error
}

func realSystem(r *supervisor.Reaper) system {
	return system{
		killAll:   func(sig unix.Signal) { unix.Kill(-1, sig) },
		childless: r.Childless,
		unmount:   unix.Unmount,
		sync:      unix.Sync,
		reboot:    unix.Reboot,
	}
}

const (
	// configFetchWait bounds how long a node with no config tries to
	// fetch one from cairn.config.url.
	configFetchWait = 2 * time.Minute
	// shutdownWait bounds how long shutdown waits for a boot step that is
	// running (an fsck, a DHCP exchange) before it goes on regardless.
	shutdownWait = 90 * time.Second
	// endWait bounds how long the processes asked to end get before they
	// are killed.
	endWait = time.Second
)

func stage2() error {
	reaper := supervisor.NewReaper()
	n := newNode(realSystem(reaper), boot.InheritTimeline())
	n.reaper = reaper
	n.shutdownMarker = layout.ShutdownMarker
	n.boots = &boots{esp: espPartition{dir: layout.ESPMount}, recordPath: layout.UpgradeRecord, spoolDir: layout.UpgradeSpool,
		running: version.Version, efivars: efivarsDir, reboot: func(why string) { n.requestShutdown(unix.LINUX_REBOOT_CMD_RESTART, why) }, note: n.events.add,
		pull: pullUKI(containerdconfig.Node.Socket, containerdconfig.Node.HostsDir)}
	// Ctrl-Alt-Del arrives as SIGINT to PID 1; SIGTERM asks for a power
	// off, and so does SIGPWR (a UPS daemon's, a container runtime's
	// power button). They are heard from now on, during the boot too.
	unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, shutdownSignals...)

	booted := n.startBoot(n.bootSequence())
	for {
		select {
		case err := <-booted:
			if err != nil {
				return err // fatal: boot.Main logs it and reboots
			}
		case sig := <-sigs:
			n.requestShutdown(shutdownFor(sig), "signal "+sig.String())
		}
	}
}

// shutdownSignals are the signals PID 1 shuts the node down on.
var shutdownSignals = []os.Signal{unix.SIGTERM, unix.SIGINT, unix.SIGPWR}

// shutdownFor is the reboot(2) command of one of shutdownSignals:
// Ctrl-Alt-Del's SIGINT restarts, the others power off.
func shutdownFor(sig os.Signal) int {
	if sig == unix.SIGINT {
		return unix.LINUX_REBOOT_CMD_RESTART
	}
	return unix.LINUX_REBOOT_CMD_POWER_OFF
}

// nodeConfig is the machine config the node runs on: STATE's, or in
// recovery mode (recovery set) what could be salvaged from it.
type nodeConfig struct {
	*machineconfig.Config
	recovery *machineconfig.Recovery
	// doc is the file it was read from.
	doc []byte
}

// bootSequence is stage 2's boot, in order. What a step hands on to later
// ones is a variable here, set by the one step that finds it out.
func (n *node) bootSequence() boot.Sequence {
	// varErr is why EPHEMERAL is not mounted on /var, if it is not.
	var varErr error
	// reverted says why STATE's config went back to the previous one.
	var reverted string
	// Until STATE's config loads, the node would run on the defaults of
	// recovery mode.
	rec := machineconfig.Recover(nil)
	conf := nodeConfig{Config: rec.Config, recovery: rec}
	// Where a node with no config on STATE fetches its first one, if the
	// kernel command line says.
	cmdline, _ := os.ReadFile("/proc/cmdline")
	src := configSourceFrom(string(cmdline))
	return boot.Sequence{Name: "boot", Steps: []boot.Step{
		{Name: "mount system filesystems", Run: mountSystem, Fatal: true},
		{Name: "load kernel modules", Run: boot.LoadModules},
		{Name: "listen for the power button", Run: n.listenPowerButton},
		{Name: "enable cgroup controllers", Run: func() error { return enableControllers(cgroupRoot) }},
		{Name: "install from an install medium", Run: func() error {
			dev, err := n.installStep()
			switch {
			case err != nil:
				slog.Error("install failed: fix machine.install in the machine config, build the ISO again (cairn image build --format iso) and boot it; until then the machine waits for its power button", "err", err)
			case dev != "":
				n.events.add("install", "installed", "onto "+dev)
				n.requestShutdown(unix.LINUX_REBOOT_CMD_RESTART, "the install onto "+dev)
			default:
				return nil
			}
			<-n.stop // nothing else boots from the medium
			return err
		}},
		{Name: "prepare EPHEMERAL", Run: func() error { varErr = n.prepareEphemeral(); return varErr }},
		{Name: "mount STATE", Run: n.mountState},
		{Name: "read the boot entries", Run: func() error {
			_, err := mountEfivars(false)
			return errors.Join(err, n.boots.check())
		}},
		{Name: "check the config on trial", Run: func() error {
			why, err := checkTrial(layout.MachineConfig)
			reverted = why
			if why != "" {
				return errors.New(why)
			}
			return err
		}},
		{Name: "find a first-boot config", Run: func() error {
			if src.url != "" {
				return nil // fetched once the network is up
			}
			dev, err := noCloudFirstBoot(sysBlock, "/dev", layout.MachineConfig, layout.FirstBootConfig)
			if dev != "" {
				slog.Info("machine config from a NoCloud volume, written to STATE", "device", dev)
				n.events.add("config", "first boot", "machine config from the NoCloud volume "+dev)
			}
			return err
		}},
		{Name: "load machine config", Run: func() (err error) {
			conf, err = n.loadConfig(layout.MachineConfig)
			err = errors.Join(err, n.startConfigs(conf))
			n.configs.noteReverted(reverted)
			return err
		}},
		{Name: "set sysctls", Run: func() error {
			was, err := applySysctls(procSys, conf.Machine.Sysctls)
			n.configs.rememberSysctls(was)
			return err
		}},
		{Name: "set hostname", Run: func() error { return setHostname(conf.Machine.Hostname) }},
		{Name: "write machine files", Run: func() error { _, err := writeFiles("/", conf.Machine.Files); return err }},
		{Name: "configure network", Run: func() error { return n.configureNetwork(conf.Network) }},
		{Name: "fetch the first-boot config", Run: func() error {
			if src.url == "" || conf.recovery == nil {
				return nil
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			boot.Go("stop the config fetch at the shutdown", func() {
				select {
				case <-n.stop:
					cancel()
				case <-ctx.Done():
				}
			})
			fetched, err := fetchFirstBootConfig(ctx, src, layout.MachineConfig, layout.FirstBootConfig, configFetchWait)
			if fetched {
				slog.Info("machine config fetched, written to STATE: rebooting to boot on it", "url", src.url)
				n.events.add("config", "first boot", "machine config from "+src.url)
				n.requestShutdown(unix.LINUX_REBOOT_CMD_RESTART, "the first-boot config from "+configURLArg)
			}
			return err
		}},
		{Name: "maintenance mode", Run: func() error {
			if conf.recovery == nil || conf.recovery.API {
				return nil
			}
			if has, err := stateHasConfig(layout.MachineConfig); has || err != nil {
				return err // a config that does not load is not replaced unseen
			}
			return n.startMaintenance(machineconfig.DefaultAPIPort)
		}},
		{Name: "set the clock", Run: func() error {
			err := n.startTimeKeeper(conf.Machine.Time.Servers)
			n.configs.setTimeKeeper(n.timeKeeper)
			return err
		}},
		{Name: "serve control socket", Run: n.serveControl},
		{Name: "start services", Run: func() error {
			err := n.startNodeServices(conf, varErr)
			if conf.recovery == nil {
				boot.Go("keep the config once healthy", func() { n.configs.keepIfHealthy(n.servicesHealthy, trialDeadline, n.stop) })
			}
			boot.Go("bless the UKI once healthy", func() { n.boots.blessIfHealthy(n.servicesHealthy, n.stop) })
			return err
		}},
	}}
}

// startBoot runs the boot sequence in the background and returns its
// outcome: nil once it ran to its end or was stopped by the shutdown, else
// its fatal error.
func (n *node) startBoot(seq boot.Sequence) <-chan error {
	booted := make(chan struct{})
	n.mu.Lock()
	n.booted = booted
	n.mu.Unlock()
	out := make(chan error, 1)
	boot.Go("boot", func() {
		defer close(booted)
		err := seq.Run(n.timeline, n.stop)
		switch {
		case errors.Is(err, boot.ErrStopped):
			err = nil // by the shutdown, which goes on
		case err == nil:
			slog.Info("boot done", "at", boot.SinceBoot().Round(time.Millisecond))
		}
		out <- err
	})
	return out
}

// addDisk notes a filesystem on disk that the boot mounted.
func (n *node) addDisk(path string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.disks = append(n.disks, path)
}

// requestShutdown starts the shutdown (once; later requests are no-ops)
// in a goroutine of its own, so the caller — a signal, the power button,
// the control socket — returns at once.
func (n *node) requestShutdown(cmd int, by string) {
	slog.Info("shutdown requested", "by", by, "then", shutdownWhat(cmd))
	n.events.add("shutdown", shutdownWhat(cmd), "asked by "+by)
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
	// Every mount shared, as systemd makes them: a CSI driver's mounts in
	// its container (Bidirectional) then reach the node and the pods.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make / a shared mount: %w", err)
	}
	// Tools such as resize2fs look for mounts in /etc/mtab.
	if err := os.Symlink("/proc/self/mounts", "/etc/mtab"); err != nil && !os.IsExist(err) {
		return err
	}
	return boot.MountAll([]boot.Mount{
		{Source: "tmpfs", Target: "/run", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=0755"},
		{Source: "tmpfs", Target: "/tmp", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"},
		{Source: "devpts", Target: "/dev/pts", FSType: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "ptmxmode=0666,mode=0620"},
		{Source: "tmpfs", Target: "/dev/shm", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"},
		{Source: "cgroup2", Target: cgroupRoot, FSType: "cgroup2", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Data: "nsdelegate"},
	})
}

// enableControllers delegates every cgroup v2 controller available in the
// cgroup dir (the root, cgroupRoot) to its children, where services and
// pods are placed.
func enableControllers(dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return err
	}
	var enable []string
	for _, c := range strings.Fields(string(raw)) {
		enable = append(enable, "+"+c)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0o644); err != nil {
		return fmt.Errorf("enable controllers %v in %s: %w", enable, dir, err)
	}
	return nil
}

func (n *node) mountState() error {
	dev, err := findPartition(sysBlock, "STATE", partitionWait)
	if err != nil {
		return err
	}
	if err := boot.MountAll([]boot.Mount{{Source: dev, Target: layout.StateDir, FSType: "ext4", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Data: ""}}); err != nil {
		return err
	}
	n.addDisk(layout.StateDir)
	return nil
}

// loadConfig loads the machine config at path (STATE's). When it cannot,
// the node runs in recovery mode on what machineconfig.Recover salvages
// from the file (hostname, network, API credentials, else defaults): the
// network comes up, and the management API answers if its credentials were
// salvaged, so that the operator can see why; nothing else the config asks
// for runs.
func (n *node) loadConfig(path string) (nodeConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		err = fmt.Errorf("read machine config: %w", err)
	} else if cfg, perr := machineconfig.Parse(data); perr != nil {
		err = fmt.Errorf("%s: %w", path, perr)
	} else {
		return nodeConfig{Config: cfg, doc: data}, nil
	}
	rec := machineconfig.Recover(data)
	n.mu.Lock()
	n.loadErr = err
	n.mu.Unlock()
	slog.Error("the machine config cannot be loaded", "path", path, "err", err)
	slog.Warn(rec.String())
	slog.Warn("the node runs no system services and no kubelet until its machine config loads: " + recoveryAdvice)
	return nodeConfig{Config: rec.Config, recovery: rec, doc: data}, fmt.Errorf("%w; %s", err, rec)
}

// startConfigs hands the config the node boots with to the control
// socket's config calls, and writes it where the agent reads it.
func (n *node) startConfigs(conf nodeConfig) error {
	live := liveTargets{procSys: procSys, root: "/", staticPodDir: layout.StaticPodDir}
	reboot := func() { n.requestShutdown(unix.LINUX_REBOOT_CMD_RESTART, "a machine config applied with a reboot") }
	c, err := newConfigs(layout.MachineConfig, layout.RunningConfig, live, conf.Config, conf.doc, conf.recovery != nil, reboot)
	if c != nil {
		c.note = n.events.add
	}
	n.mu.Lock()
	n.configs = c
	n.mu.Unlock()
	return err
}

// recoveryAdvice is what an operator does about a config that does not load.
const recoveryAdvice = "check the file with `cairn config validate FILE`, then apply a valid machine config with `cairn node apply -f FILE --mode reboot` (or put it at config.yaml on the STATE partition and reboot)"

// servicesHealthy reports whether containerd and the agent are Ready:
// what a config on trial must reach to be kept.
func (n *node) servicesHealthy() bool {
	n.mu.Lock()
	sup := n.services
	n.mu.Unlock()
	if sup == nil {
		return false
	}
	ready := 0
	for _, s := range sup.Status() {
		if (s.Name == "containerd" || s.Name == "cairn-agent") && s.Ready {
			ready++
		}
	}
	return ready == 2
}

// startNodeServices starts the services, unless in recovery mode without
// API credentials: then no management API can be served, and nothing the
// config asked for runs either.
func (n *node) startNodeServices(conf nodeConfig, varErr error) error {
	if conf.recovery != nil && !conf.recovery.API {
		slog.Warn("no management API: the machine config holds no usable machine.api credentials; the node answers on its network only (DHCP, ping)")
		return fmt.Errorf("none started in recovery mode: no usable machine.api credentials, so no management API; %s", recoveryAdvice)
	}
	return n.startServices(conf.Config, varErr)
}

func setHostname(name string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("sethostname %q: %w", name, err)
	}
	hosts := fmt.Sprintf("127.0.0.1 localhost\n::1 localhost\n127.0.1.1 %s\n", name)
	return errors.Join(
		os.WriteFile("/etc/hostname", []byte(name+"\n"), 0o644),
		os.WriteFile("/etc/hosts", []byte(hosts), 0o644),
	)
}

// shutdown runs the shutdown sequence, once; PID 1 never returns from it.
func (n *node) shutdown(cmd int) {
	n.shutdownOnce.Do(func() {
		slog.Info("shutting down", "then", shutdownWhat(cmd))
		close(n.stop)
		n.shutdownSequence(cmd).Run(n.timeline, nil)
	})
}

// shutdownSequence stops the boot and the services (each after those that
// depend on it), ends every other process, syncs, unmounts the disks and
// powers off or reboots. Whatever is missing (no supervisor after a boot
// that went wrong) or fails on the way, even a panic, the node still goes
// down: no step is fatal, and the last does not return.
func (n *node) shutdownSequence(cmd int) boot.Sequence {
	var (
		sup   *supervisor.Supervisor
		disks []string
	)
	steps := []boot.Step{
		{Name: "stop the boot", Run: func() (err error) { sup, disks, err = n.stopBoot(shutdownWait); return err }},
		{Name: "tell the agent", Run: func() error { return n.markShutdown(cmd) }},
		{Name: "stop services", Run: func() error { return stopServices(sup, n.shutdownGrace()) }},
		{Name: "end processes", Run: n.endProcesses},
		{Name: "sync", Run: func() error { n.sys.sync(); return nil }},
		{Name: "unmount disks", Run: func() error { n.unmountDisks(disks); return nil }},
	}
	n.mu.Lock()
	plan := n.resetting
	n.mu.Unlock()
	if plan != nil {
		steps = append(steps, boot.Step{Name: "reset: wipe " + plan.what(), Run: func() error { return n.wipe(plan) }})
	}
	steps = append(steps, boot.Step{Name: shutdownWhat(cmd), Run: func() error { n.reboot(cmd); return nil }})
	return boot.Sequence{Name: "shutdown", Steps: steps}
}

// stopBoot waits up to wait for the boot step that is running, if any (the
// boot has been told to stop), and returns the supervisor (nil if there is
// none) and the disks the boot mounted. If the step does not end in time,
// the services are not known, and the disks are what stage 2 mounts on
// disk, by name, in the order of the boot.
func (n *node) stopBoot(wait time.Duration) (*supervisor.Supervisor, []string, error) {
	n.mu.Lock()
	booted := n.booted
	n.mu.Unlock()
	if booted != nil {
		select {
		case <-booted:
		case <-time.After(wait):
			return nil, []string{varDir, layout.StateDir}, fmt.Errorf("a boot step is still running after %s: shutting down without stopping the services in order", wait)
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.services, slices.Clone(n.disks), nil
}

// markShutdown writes the shutdown marker, which tells the agent, as it
// is stopped, that the node shuts down: it then ends the pods first.
func (n *node) markShutdown(cmd int) error {
	if n.shutdownMarker == "" {
		return nil // outside a node
	}
	return os.WriteFile(n.shutdownMarker, []byte(shutdownWhat(cmd)+"\n"), 0o644)
}

// shutdownGrace is how long the pods get to end at the node's shutdown,
// as the running config says.
func (n *node) shutdownGrace() time.Duration {
	n.mu.Lock()
	c := n.configs
	n.mu.Unlock()
	if c == nil {
		return 0
	}
	grace, _ := c.running().cfg.Machine.Shutdown.Periods()
	return grace
}

// stopServices stops every service, each after those that depend on it,
// within a minute and grace, the time the pods get to end.
func stopServices(sup *supervisor.Supervisor, grace time.Duration) error {
	if sup == nil {
		return nil // the boot started none
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute+grace)
	defer cancel()
	if err := sup.Stop(ctx); err != nil {
		return fmt.Errorf("services did not stop in time: %w", err)
	}
	return nil
}

// endProcesses asks every other process to end and kills those left once
// PID 1 has no child (every process is a descendant of PID 1 and an orphan
// becomes its child) or after endWait.
func (n *node) endProcesses() error {
	n.sys.killAll(unix.SIGTERM)
	select {
	case <-n.sys.childless():
	case <-time.After(endWait):
		slog.Warn("processes still running, killing them", "waited", endWait)
	}
	n.sys.killAll(unix.SIGKILL)
	return nil
}

// unmountDisks unmounts the disks in the reverse order of the boot, what
// is mounted below each first; one that is busy is detached.
func (n *node) unmountDisks(disks []string) {
	for i := len(disks) - 1; i >= 0; i-- {
		n.unmountBelow(disks[i])
		if err := n.sys.unmount(disks[i], 0); err != nil && !errors.Is(err, unix.EINVAL) {
			slog.Warn("unmount failed, detaching", "path", disks[i], "err", err)
			n.sys.unmount(disks[i], unix.MNT_DETACH)
		}
	}
}

// reboot powers off or reboots, trying again each second should the
// syscall fail.
func (n *node) reboot(cmd int) {
	slog.Info("bye", "then", shutdownWhat(cmd))
	n.sys.sync()
	for {
		if err := boot.Catch("reboot", func() error { return n.sys.reboot(cmd) }); err != nil {
			slog.Error("reboot syscall failed", "err", err)
		}
		time.Sleep(time.Second)
	}
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
