package supervisor

import (
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/supervisor/safe"
)

// Reaper is the single place where a PID 1 collects exit statuses: it reaps
// every child on SIGCHLD and hands each status to whoever started that PID.
// Orphans re-parented to PID 1 are reaped and forgotten. Because nothing else
// calls wait, reaping and waiting never race.
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]chan Exit
	// childless are closed once wait4 finds no child left.
	childless []chan struct{}
}

// NewReaper starts reaping. Call it once, early in PID 1, before any child
// is started; never call exec.Cmd.Wait on a process it started.
func NewReaper() *Reaper {
	r := &Reaper{waiters: make(map[int]chan Exit)}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGCHLD)
	safe.Go(slog.Default(), "reaper", func() {
		for range sigs {
			// A panic here would end all reaping: log it, and go on.
			guard(slog.Default(), "reap", func() error { r.reap(); return nil })
		}
	})
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

// Childless returns a channel closed once the process has no child left,
// every one reaped: at shutdown, once the processes signalled to end are
// gone. Orphans re-parented to PID 1 count as its children.
func (r *Reaper) Childless() <-chan struct{} {
	ch := make(chan struct{})
	r.mu.Lock()
	r.childless = append(r.childless, ch)
	r.mu.Unlock()
	// No SIGCHLD comes if there is no child left to exit: look now.
	r.reap()
	return ch
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
		if err == unix.ECHILD {
			r.mu.Lock()
			for _, ch := range r.childless {
				close(ch)
			}
			r.childless = nil
			r.mu.Unlock()
			return
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
