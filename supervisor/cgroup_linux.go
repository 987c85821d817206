package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs2"
	"golang.org/x/sys/unix"
)

// cgroupLauncher places each run of a service in its own cgroup v2, with
// the limits of res that the kernel offers there. Kill on its instances ends
// every process in the cgroup and removes it.
type cgroupLauncher struct {
	Launcher
	root string // the cgroup v2 mount, e.g. /sys/fs/cgroup
	dir  string // the service's cgroup, below root
	log  *slog.Logger

	mu  sync.Mutex
	res *cgroups.Resources // the runs' limits; SetResources changes them
}

func (l *cgroupLauncher) Launch(ctx context.Context, opts LaunchOptions) (Instance, error) {
	l.mu.Lock()
	res := l.res
	l.mu.Unlock()
	mgr, err := l.create(res)
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", l.dir, err)
	}
	opts.Cgroup = l.dir
	inst, err := l.Launcher.Launch(ctx, opts)
	if err != nil {
		mgr.Destroy()
		return nil, err
	}
	// A no-op when the launcher started the run inside the cgroup already.
	if err := mgr.AddPid("", inst.Pid()); err != nil {
		l.log.Warn("could not move the service into its cgroup", "cgroup", l.dir, "err", err)
	}
	return cgroupInstance{Instance: inst, dir: l.dir, mgr: mgr}, nil
}

// setResources makes res the limits of the runs to come and, if a run
// is on, of its cgroup now; a limit res does not set goes back to none
// (cpu.weight to the kernel's 100).
func (l *cgroupLauncher) setResources(res *cgroups.Resources) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.res = res
	if _, err := os.Stat(l.dir); errors.Is(err, fs.ErrNotExist) {
		return nil // no run now: the next one gets them
	}
	if _, err := l.create(unlimitedWhereUnset(res)); err != nil {
		return fmt.Errorf("cgroup %s: %w", l.dir, err)
	}
	return nil
}

// unlimitedWhereUnset is r with every memory, cpu and pids limit it does
// not set written as the kernel's default, to take back an earlier one. A
// memory limit below what the cgroup uses is refused, not met by the OOM
// killer.
func unlimitedWhereUnset(r *cgroups.Resources) *cgroups.Resources {
	var out cgroups.Resources
	if r != nil {
		out = *r
	}
	out.MemoryCheckBeforeUpdate = true
	if out.Memory == 0 {
		out.Memory = -1 // max
	}
	if out.CpuQuota == 0 {
		out.CpuQuota, out.CpuPeriod = -1, 0 // max, with the default period
	}
	if out.CpuWeight == 0 {
		out.CpuWeight = 100
	}
	if out.PidsLimit == nil {
		unlimited := int64(-1)
		out.PidsLimit = &unlimited
	}
	return &out
}

// create makes the cgroup and its parents, enables in each parent the
// controllers the limits need, and sets the limits whose controller is
// available, logging the others.
func (l *cgroupLauncher) create(limits *cgroups.Resources) (*fs2.Manager, error) {
	want := controllersFor(limits)
	rel, err := filepath.Rel(l.root, l.dir)
	if err != nil {
		return nil, err
	}
	parent := l.root
	for elem := range strings.SplitSeq(rel, "/") {
		l.enable(parent, want)
		parent = filepath.Join(parent, elem)
		if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
	}
	res, err := l.available(limits, want)
	if err != nil {
		return nil, err
	}
	mgr, err := fs2.NewManager(&cgroups.Cgroup{Resources: res}, l.dir)
	if err != nil {
		return nil, err
	}
	if err := mgr.Set(res); err != nil {
		return nil, fmt.Errorf("set limits: %w", err)
	}
	return mgr, nil
}

// enable turns on in dir's cgroup.subtree_control each wanted controller
// that dir has.
func (l *cgroupLauncher) enable(dir string, want []string) {
	if len(want) == 0 {
		return
	}
	have, _ := cgroups.ReadFile(dir, "cgroup.controllers")
	on, _ := cgroups.ReadFile(dir, "cgroup.subtree_control")
	for _, c := range want {
		if !slices.Contains(strings.Fields(have), c) || slices.Contains(strings.Fields(on), c) {
			continue
		}
		if err := cgroups.WriteFile(dir, "cgroup.subtree_control", "+"+c); err != nil {
			l.log.Warn("could not enable cgroup controller", "cgroup", dir, "controller", c, "err", err)
		}
	}
}

// available returns the limits whose controller is enabled in the
// service's cgroup.
func (l *cgroupLauncher) available(limits *cgroups.Resources, want []string) (*cgroups.Resources, error) {
	if limits == nil {
		return nil, nil
	}
	raw, err := cgroups.ReadFile(l.dir, "cgroup.controllers")
	if err != nil {
		return nil, err
	}
	have := strings.Fields(raw)
	res := *limits
	for _, c := range want {
		if slices.Contains(have, c) {
			continue
		}
		l.log.Warn("cgroup controller not available, its limits are not applied", "cgroup", l.dir, "controller", c)
		switch c {
		case "memory":
			res.Memory, res.MemoryReservation, res.MemorySwap = 0, 0, 0
		case "cpu":
			res.CpuWeight, res.CpuQuota, res.CpuPeriod, res.CPUIdle, res.CpuBurst = 0, 0, 0, nil, nil
		case "pids":
			res.PidsLimit = nil
		case "hugetlb":
			res.HugetlbLimit = nil
		}
	}
	return &res, nil
}

// controllersFor lists the memory, cpu, pids and hugetlb controllers that
// the limits in r need. Other limits are passed on as they are.
func controllersFor(r *cgroups.Resources) []string {
	if r == nil {
		return nil
	}
	var cs []string
	if r.Memory != 0 || r.MemoryReservation != 0 || r.MemorySwap != 0 {
		cs = append(cs, "memory")
	}
	if r.CpuWeight != 0 || r.CpuQuota != 0 || r.CpuPeriod != 0 || r.CPUIdle != nil || r.CpuBurst != nil {
		cs = append(cs, "cpu")
	}
	if r.PidsLimit != nil {
		cs = append(cs, "pids")
	}
	if len(r.HugetlbLimit) > 0 {
		cs = append(cs, "hugetlb")
	}
	return cs
}

type cgroupInstance struct {
	Instance
	dir string
	mgr *fs2.Manager
}

// Kill ends every process in the cgroup, waits for it to empty and removes
// it, then kills the run's process group too, for a run that could not be
// moved into the cgroup.
func (c cgroupInstance) Kill() error {
	err := killCgroup(c.mgr)
	if err == nil {
		err = waitEmpty(c.dir, 5*time.Second)
	}
	if err == nil {
		err = c.mgr.Destroy()
	}
	if err != nil {
		err = fmt.Errorf("kill cgroup %s: %w", c.dir, err)
	}
	return errors.Join(err, c.Instance.Kill())
}

// killCgroup sends SIGKILL to every process in the cgroup and below, with
// cgroup.kill where the kernel has it (5.14 and later).
func killCgroup(mgr *fs2.Manager) error {
	dir := mgr.Path("")
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err == nil {
		return cgroups.WriteFile(dir, "cgroup.kill", "1")
	}
	return killEach(mgr)
}

// killEach kills the processes listed in cgroup.procs until none is left,
// for kernels without cgroup.kill. It repeats because a process may fork
// between the listing and its death.
func killEach(mgr *fs2.Manager) error {
	var pids []int
	for range 100 {
		var err error
		pids, err = mgr.GetAllPids()
		if err != nil || len(pids) == 0 {
			return err
		}
		for _, pid := range pids {
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("kill pid %d: %w", pid, err)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("processes %v still alive", pids)
}

// waitEmpty waits until no process is left in the cgroup or below, up to
// timeout. The kernel reports each change of cgroup.events ("populated 0"
// once empty) as a modification of the file, seen here through inotify.
func waitEmpty(dir string, timeout time.Duration) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	// Non-blocking, so reads go through the runtime's poller and honour
	// the deadline.
	watch := os.NewFile(uintptr(fd), "inotify")
	defer watch.Close()
	if _, err := unix.InotifyAddWatch(fd, filepath.Join(dir, "cgroup.events"), unix.IN_MODIFY); errors.Is(err, unix.ENOENT) {
		return nil
	} else if err != nil {
		return fmt.Errorf("watch %s/cgroup.events: %w", dir, err)
	}
	watch.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 4096)
	for {
		// Read after the watch is set, so no change is missed between.
		events, err := cgroups.ReadFile(dir, "cgroup.events")
		if errors.Is(err, fs.ErrNotExist) || strings.Contains(events, "populated 0") {
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := watch.Read(buf); errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("still populated after %s", timeout)
		} else if err != nil {
			return fmt.Errorf("read inotify events: %w", err)
		}
	}
}
