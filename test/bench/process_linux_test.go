//go:build bench

package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is a contender's process, its output going to a log file.
type proc struct {
	name, log string
	cmd       *exec.Cmd
	exited    chan struct{}
	after     func() // undoes what the process leaves behind
	stopped   sync.Once
	// ready, if not nil, waits until the whole process is at work, once
	// its Node is Ready; summary, if not nil, is a line on what the
	// process's own figures say it did.
	ready   func(context.Context) error
	summary func(context.Context) (string, error)
}

// startProc starts cmd in a process group of its own, killed if the
// benchmark dies, and stops it when b ends; after, if not nil, runs once
// it has stopped.
func startProc(b *testing.B, name, log string, cmd *exec.Cmd, after func()) *proc {
	b.Helper()
	f, err := os.Create(log)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, log: log, cmd: cmd, exited: make(chan struct{}), after: after}
	go func() { cmd.Wait(); close(p.exited) }()
	b.Cleanup(p.stop)
	return p
}

// stopGrace is how long a contender gets after SIGTERM before SIGKILL.
const stopGrace = 15 * time.Second

// stop stops the process group with SIGTERM, then SIGKILL, waits, and
// runs p.after; only the first call does anything.
func (p *proc) stop() {
	p.stopped.Do(func() {
		pgid := -p.cmd.Process.Pid
		syscall.Kill(pgid, syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(stopGrace):
			syscall.Kill(pgid, syscall.SIGKILL)
			<-p.exited
		}
		if p.after != nil {
			p.after()
		}
	})
}

// running returns an error if the process has exited.
func (p *proc) running() error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s exited: %v\n%s", p.name, p.cmd.ProcessState, p.tail())
	default:
		return nil
	}
}

// tail is the end of the process's log, for failure messages.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return fmt.Sprintf("--- last lines of %s (%s):\n%s", p.name, p.log, b)
}

// command is the process's command line as /proc/PID/cmdline has it now,
// the arguments separated by spaces.
func (p *proc) command() (string, error) { return pidCommand(p.cmd.Process.Pid) }

func pidCommand(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return "", err
	}
	return strings.Join(strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), " "), nil
}

// userHZ is the unit of /proc/PID/stat's times: USER_HZ, 100 on Linux.
const userHZ = 100

// cpu is the CPU time, user and system, that the process and its children
// that it waited for have used so far.
func (p *proc) cpu() (time.Duration, error) { return pidCPU(p.cmd.Process.Pid) }

func pidCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name in parentheses, from the state
	// (field 3) on: utime, stime, cutime and cstime are fields 14 to 17.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	var ticks int64
	for _, v := range f[11:15] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// mem returns the process's resident set size now and at its peak
// (VmRSS and VmHWM), in bytes.
func (p *proc) mem() (rss, peak int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &rss
		case "VmHWM":
			dst = &peak
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s of %s: %w", k, p.name, err)
		}
		*dst = kb << 10
	}
	return rss, peak, sc.Err()
}

// hostCPU returns the CPU time the host's CPUs have been busy, and their
// total time, since boot.
func hostCPU() (busy, total time.Duration, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	// cpu user nice system idle iowait irq softirq steal guest guest_nice;
	// guest time is counted in user time already.
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: first line %q", line)
	}
	for i, v := range f[1:9] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
		d := time.Duration(n) * time.Second / userHZ
		total += d
		if i != 3 && i != 4 { // idle, iowait
			busy += d
		}
	}
	return busy, total, nil
}
