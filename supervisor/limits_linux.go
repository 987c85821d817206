package supervisor

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Limits are a cgroup v2's limits as the kernel reports them: each field is
// the content of its interface file ("max" for no limit), or empty when the
// cgroup has no such file because the controller is not enabled there.
type Limits struct {
	// Cgroup is the cgroup's path below the cgroup2 mount, e.g.
	// /system/containerd.
	Cgroup    string
	MemoryMax string // memory.max: bytes
	CPUMax    string // cpu.max: "QUOTA PERIOD" in microseconds
	CPUWeight string // cpu.weight
	PidsMax   string // pids.max
}

// ProcessLimits reads back the limits of the cgroup v2 that process pid is
// in, from the cgroup2 filesystem mounted at root (e.g. /sys/fs/cgroup).
// What it returns is what the kernel enforces, whoever set it.
func ProcessLimits(root string, pid int) (Limits, error) {
	cg, err := processCgroup(pid)
	if err != nil {
		return Limits{}, err
	}
	dir := filepath.Join(root, cg)
	l := Limits{Cgroup: cg}
	for _, f := range []struct {
		name string
		to   *string
	}{
		{"memory.max", &l.MemoryMax},
		{"cpu.max", &l.CPUMax},
		{"cpu.weight", &l.CPUWeight},
		{"pids.max", &l.PidsMax},
	} {
		raw, err := os.ReadFile(filepath.Join(dir, f.name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return l, fmt.Errorf("read limits of pid %d: %w", pid, err)
		default:
			*f.to = strings.TrimSpace(string(raw))
		}
	}
	return l, nil
}

// processCgroup returns the cgroup v2 path of pid, from /proc/<pid>/cgroup.
func processCgroup(pid int) (string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", fmt.Errorf("cgroup of pid %d: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if cg, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			return cg, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("cgroup of pid %d: %w", pid, err)
	}
	return "", fmt.Errorf("cgroup of pid %d: not in a cgroup v2 hierarchy", pid)
}
