package supervisor

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/need"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs2"
)

// cgroupRoot returns where cgroup v2 is mounted: /sys/fs/cgroup on a node,
// /sys/fs/cgroup/unified on a hybrid host, and a name for the test's cgroup
// below it. At the end it removes that cgroup and turns off in the root the
// controllers the supervisor turned on.
func cgroupRoot(t *testing.T) (root, testCgroup string) {
	t.Helper()
	need.Root(t, "cgroups")
	root = need.CgroupV2(t)
	testCgroup = fmt.Sprintf("supervisor-test-%d-%s", os.Getpid(), t.Name())
	before, err := cgroups.ReadFile(root, "cgroup.subtree_control")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dir := filepath.Join(root, testCgroup)
		mgr, err := fs2.NewManager(&cgroups.Cgroup{}, dir)
		if err != nil {
			t.Error(err)
			return
		}
		killEach(mgr)
		if err := mgr.Destroy(); err != nil {
			t.Errorf("remove test cgroup: %v", err)
		}
		after, _ := cgroups.ReadFile(root, "cgroup.subtree_control")
		for _, c := range strings.Fields(after) {
			if !slices.Contains(strings.Fields(before), c) {
				if err := cgroups.WriteFile(root, "cgroup.subtree_control", "-"+c); err != nil {
					t.Errorf("turn %s off again in %s: %v", c, root, err)
				}
			}
		}
	})
	return root, testCgroup
}

// TestStopKillsCgroup stops a service that ignores SIGTERM and whose child,
// in a session of its own, ignores it too: after the stop timeout both die
// with the whole cgroup, which is then removed.
func TestStopKillsCgroup(t *testing.T) {
	root, cg := cgroupRoot(t)
	dir := t.TempDir()
	mainPid, childPid := filepath.Join(dir, "main"), filepath.Join(dir, "child")
	s := New(Options{Log: quietLog(), CgroupRoot: root})
	const timeout = 300 * time.Millisecond
	err := s.Add(Service{
		Name: "stubborn", Path: "/bin/sh", Cgroup: cg + "/stubborn", StopTimeout: timeout,
		Args: []string{"-c", `trap '' TERM
setsid sh -c 'echo $$ > "$1"; exec sleep 60' sh "$2" &
echo $$ > "$1"
wait`, "sh", mainPid, childPid},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	pids := make([]int, 2)
	for i, f := range []string{mainPid, childPid} {
		waitFor(t, filepath.Base(f)+" pid", func() bool {
			raw, _ := os.ReadFile(f)
			pids[i], err = strconv.Atoi(strings.TrimSpace(string(raw)))
			return err == nil
		})
	}
	cgDir := filepath.Join(root, cg, "stubborn")
	procs, err := cgroups.GetPids(cgDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if !slices.Contains(procs, pid) {
			t.Errorf("cgroup.procs = %v, want pid %d in it", procs, pid)
		}
	}

	start := time.Now()
	stop(t, s)
	if took := time.Since(start); took < timeout {
		t.Errorf("Stop took %s, want at least the stop timeout %s", took, timeout)
	}
	for _, pid := range pids {
		waitFor(t, fmt.Sprintf("pid %d gone", pid), func() bool { return gone(pid) })
	}
	if _, err := os.Stat(cgDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s after Stop: %v, want it removed", cgDir, err)
	}
	if st := status(t, s, "stubborn"); st.LastExit != "killed by signal killed" {
		t.Errorf("LastExit = %q, want %q", st.LastExit, "killed by signal killed")
	}
}

// gone reports whether pid has exited (a zombie counts as exited: its
// parent, here the host's init, reaps it in its own time).
func gone(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}

// TestCgroupLimits sets memory, cpu, pids and hugetlb limits: those whose
// controller is available are written, the others are logged and the
// service runs. ProcessLimits reads back, from the service's process, the
// limits that were written.
func TestCgroupLimits(t *testing.T) {
	root, cg := cgroupRoot(t)
	var logs syncBuffer
	s := New(Options{Log: slog.New(slog.NewTextHandler(&logs, nil)), CgroupRoot: root})
	pids, weight := int64(64), uint64(50)
	err := s.Add(Service{
		Name: "limited", Path: "/bin/sleep", Args: []string{"60"}, Cgroup: cg + "/limited",
		Resources: &cgroups.Resources{
			Memory: 64 << 20, CpuWeight: weight, CpuQuota: 25_000, CpuPeriod: 100_000, PidsLimit: &pids,
			HugetlbLimit: []*cgroups.HugepageLimit{{Pagesize: "2MB", Limit: 4 << 20}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	st := waitState(t, s, "limited", StateReady)
	if st.Reason != "" {
		t.Errorf("Reason = %q, want none", st.Reason)
	}
	limits, err := ProcessLimits(root, st.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if want := "/" + cg + "/limited"; limits.Cgroup != want {
		t.Errorf("ProcessLimits().Cgroup = %q, want %q", limits.Cgroup, want)
	}
	readBack := map[string]string{"memory.max": limits.MemoryMax, "cpu.max": limits.CPUMax, "cpu.weight": limits.CPUWeight, "pids.max": limits.PidsMax}
	available, err := cgroups.ReadFile(root, "cgroup.controllers")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, cg, "limited")
	var applied []string
	for _, limit := range []struct{ controller, file, want string }{
		{"memory", "memory.max", "67108864"},
		{"cpu", "cpu.weight", "50"},
		{"cpu", "cpu.max", "25000 100000"},
		{"pids", "pids.max", "64"},
		{"hugetlb", "hugetlb.2MB.max", "4194304"},
	} {
		if !slices.Contains(strings.Fields(available), limit.controller) {
			want := "controller=" + limit.controller
			if !strings.Contains(logs.String(), want) {
				t.Errorf("%s is not available, and the log does not say so:\n%s", limit.controller, logs.String())
			}
			if got, ok := readBack[limit.file]; ok && got != "" {
				t.Errorf("ProcessLimits() read %s = %q, want nothing without the %s controller", limit.file, got, limit.controller)
			}
			continue
		}
		got, err := cgroups.ReadFile(dir, limit.file)
		if err != nil || strings.TrimSpace(got) != limit.want {
			t.Errorf("%s = %q, %v; want %q", limit.file, got, err, limit.want)
		}
		if got, ok := readBack[limit.file]; ok && got != limit.want {
			t.Errorf("ProcessLimits() read %s = %q, want %q", limit.file, got, limit.want)
		}
		applied = append(applied, limit.controller)
	}
	t.Logf("limits applied for %v; the other controllers are not available in %s", applied, root)
}

// TestSetResources changes a running service's limits: at once, in its
// cgroup, with the same process; a limit dropped is lifted; a restart
// runs with the limits set last. Only the controllers the host's cgroup v2
// has are checked (a hybrid host may have none of them there); the e2e
// suite checks all of them on a node.
func TestSetResources(t *testing.T) {
	root, cg := cgroupRoot(t)
	s := New(Options{Log: quietLog(), CgroupRoot: root})
	pids := int64(64)
	for _, svc := range []Service{
		{Name: "changing", Path: "/bin/sleep", Args: []string{"60"}, Cgroup: cg + "/changing", Resources: &cgroups.Resources{Memory: 64 << 20, PidsLimit: &pids}},
		{Name: "nocgroup", Path: "/bin/sleep", Args: []string{"60"}},
	} {
		if err := s.Add(svc); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	raw, err := cgroups.ReadFile(root, "cgroup.controllers")
	if err != nil {
		t.Fatal(err)
	}
	available := strings.Fields(raw)
	pid := waitState(t, s, "changing", StateReady).Pid
	// check compares the limits the kernel enforces, of the controllers
	// available, with want.
	check := func(when string, want map[string]string) {
		t.Helper()
		l, err := ProcessLimits(root, pid)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{"memory.max": l.MemoryMax, "cpu.max": l.CPUMax, "cpu.weight": l.CPUWeight, "pids.max": l.PidsMax}
		for file, v := range want {
			if slices.Contains(available, strings.Split(file, ".")[0]) && got[file] != v {
				t.Errorf("%s: %s = %q, want %q", when, file, got[file], v)
			}
		}
	}
	check("at the start", map[string]string{"memory.max": "67108864", "pids.max": "64"})

	if err := s.SetResources("changing", &cgroups.Resources{Memory: 128 << 20, CpuQuota: 50_000, CpuPeriod: 100_000}); err != nil {
		t.Fatal(err)
	}
	check("after a change", map[string]string{"memory.max": "134217728", "cpu.max": "50000 100000", "cpu.weight": "100", "pids.max": "max"})
	if now := status(t, s, "changing").Pid; now != pid {
		t.Errorf("the service's pid went from %d to %d: a change of limits restarted it", pid, now)
	}

	if err := s.SetResources("changing", nil); err != nil {
		t.Fatal(err)
	}
	check("after every limit dropped", map[string]string{"memory.max": "max", "cpu.max": "max 100000", "cpu.weight": "100", "pids.max": "max"})

	if err := s.SetResources("changing", &cgroups.Resources{Memory: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart("changing"); err != nil {
		t.Fatal(err)
	}
	pid = waitState(t, s, "changing", StateReady).Pid
	check("after a restart", map[string]string{"memory.max": "33554432"})

	if err := s.SetResources("nocgroup", nil); err == nil || !strings.Contains(err.Error(), "no cgroup of its own") {
		t.Errorf("SetResources of a service without a cgroup = %v, want an error saying so", err)
	}
	if err := s.SetResources("none", nil); err == nil {
		t.Error("SetResources of an unknown service succeeded")
	}
	t.Logf("limits checked for the controllers %v of %s", available, root)
}

// TestKillEach is the way to kill a cgroup on kernels without cgroup.kill.
func TestKillEach(t *testing.T) {
	root, cg := cgroupRoot(t)
	dir := filepath.Join(root, cg)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mgr, err := fs2.NewManager(&cgroups.Cgroup{}, dir)
	if err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	for range 3 {
		cmd := exec.Command("/bin/sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		if err := mgr.AddPid("", cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	if err := killEach(mgr); err != nil {
		t.Fatalf("killEach() = %v, want nil", err)
	}
	for _, cmd := range cmds {
		err := cmd.Wait()
		if ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Errorf("sleep %d: Wait() = %v, want killed by SIGKILL", cmd.Process.Pid, err)
		}
	}
	if err := waitEmpty(dir, time.Second); err != nil {
		t.Errorf("waitEmpty() = %v, want nil", err)
	}
}

// TestWaitEmpty waits for a cgroup to empty on the kernel's notification:
// it returns once the last process dies, and not before; a cgroup that
// stays populated is an error after the timeout.
func TestWaitEmpty(t *testing.T) {
	root, cg := cgroupRoot(t)
	dir := filepath.Join(root, cg)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mgr, err := fs2.NewManager(&cgroups.Cgroup{}, dir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := mgr.AddPid("", cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := waitEmpty(dir, 200*time.Millisecond); err == nil || !strings.Contains(err.Error(), "still populated") {
		t.Errorf("waitEmpty(populated) = %v, want still populated after the timeout", err)
	}
	done := make(chan error, 1)
	go func() { done <- waitEmpty(dir, time.Minute) }()
	// Killed once the wait has begun watching, or before: either way the
	// wait ends on the cgroup's state, not on its timeout.
	cmd.Process.Kill()
	cmd.Wait()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("waitEmpty() = %v, want nil once the cgroup emptied", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waitEmpty() still waiting 10s after the cgroup emptied")
	}
	if events, _ := cgroups.ReadFile(dir, "cgroup.events"); !strings.Contains(events, "populated 0") {
		t.Errorf("cgroup.events = %q after waitEmpty, want populated 0", events)
	}
}
