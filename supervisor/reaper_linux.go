package supervisor

import (
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Reaper is the single place where a PID 1 collects exit statuses: it reaps
// every child on SIGCHLD and hands each status to whoever started that PID.
// Orphans re-parented to PID 1 are reaped and forgotten. Because nothing else
// calls wait, reaping and waiting never race.
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]chan Exit
}

// NewReaper starts reaping. Call it once, early in PID 1, before any child
// is started; never call exec.Cmd.Wait on a process it started.
func NewReaper() *Reaper {
	r := &Reaper{waiters: make(map[int]chan Exit)}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGCHLD)
	go func() {
		for range sigs {
			// A panic here would end all reaping: log it, and go on.
			guard(slog.Default(), "reap", func() error { r.reap(); return nil })
		}
	}()
	return r
}

// Start implements Starter. The lock is held across Start so a child that
// exits at once cannot be reaped before its waiter is registered.
func (r *Reaper) Start(cmd *exec.Cmd) (<-chan Exit, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := make(chan Exit, 1)
	r.waiters[cmd.Process.Pid] = ch
	return ch, nil
}

// Run starts cmd and waits for it, for short helper commands run by PID 1.
func (r *Reaper) Run(cmd *exec.Cmd) error {
	ch, err := r.Start(cmd)
	if err != nil {
		return err
	}
	if e := <-ch; e.Failed() {
		return &ExitError{Exit: e}
	}
	return nil
}

// ExitError is returned by Run when a command did not exit with status 0.
type ExitError struct{ Exit Exit }

func (e *ExitError) Error() string { return e.Exit.String() }

func (r *Reaper) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		r.mu.Lock()
		ch, ok := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if ok {
			ch <- Exit{Status: syscall.WaitStatus(ws)}
		} else {
			slog.Debug("reaped orphan", "pid", pid, "status", Exit{Status: syscall.WaitStatus(ws)}.String())
		}
	}
}
