package supervisor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Policy says when an exited service is started again.
type Policy int

const (
	RestartAlways Policy = iota
	RestartOnFailure
	RestartNever
)

// State of a service.
type State string

const (
	StateWaiting  State = "Waiting"
	StateStarting State = "Starting"
	StateRunning  State = "Running"
	StateStopping State = "Stopping"
	StateStopped  State = "Stopped"
	StateFailed   State = "Failed"
	StateBackoff  State = "Backoff"
)

// Service describes one supervised process.
type Service struct {
	Name        string
	Path        string
	Args        []string
	Env         []string
	Dir         string
	Restart     Policy
	StopSignal  syscall.Signal // default SIGTERM
	StopTimeout time.Duration  // default 10s, then SIGKILL
	// Output receives the service's stdout and stderr, line-buffered by the
	// caller if it wants lines.
	Output io.Writer
}

// Backoff is the restart delay schedule: Initial doubling up to Max, reset
// to Initial once a run has lasted Reset.
type Backoff struct {
	Initial, Max, Reset time.Duration
}

// DefaultBackoff is 1 s doubling to 30 s, reset after a healthy minute.
var DefaultBackoff = Backoff{Initial: time.Second, Max: 30 * time.Second, Reset: time.Minute}

// next returns the delay before the next start, given the previous delay and
// how long the last run lasted.
func (b Backoff) next(prev, ran time.Duration) time.Duration {
	if prev == 0 || ran >= b.Reset {
		return b.Initial
	}
	return min(prev*2, b.Max)
}

// Supervisor runs services until Stop.
type Supervisor struct {
	starter Starter
	backoff Backoff
	log     *slog.Logger

	mu       sync.Mutex
	runners  []*runner
	stopping bool
}

// New returns a Supervisor that starts processes through starter.
func New(starter Starter, log *slog.Logger) *Supervisor {
	return &Supervisor{starter: starter, backoff: DefaultBackoff, log: log}
}

type runner struct {
	svc   Service
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	state State
	proc  *os.Process
}

// Start begins supervising svc. It returns at once; the service is started
// and restarted in the background.
func (s *Supervisor) Start(svc Service) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return fmt.Errorf("start %s: supervisor is stopping", svc.Name)
	}
	r := &runner{svc: svc, stop: make(chan struct{}), done: make(chan struct{}), state: StateWaiting}
	s.runners = append(s.runners, r)
	go s.loop(r)
	return nil
}

// State reports the current state of the named service.
func (s *Supervisor) State(name string) (State, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.runners {
		if r.svc.Name == name {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.state, true
		}
	}
	return "", false
}

func (r *runner) set(st State) {
	r.mu.Lock()
	r.state = st
	r.mu.Unlock()
}

func (s *Supervisor) loop(r *runner) {
	defer close(r.done)
	log := s.log.With("service", r.svc.Name)
	var delay time.Duration
	for {
		r.set(StateStarting)
		started := time.Now()
		exit, err := s.runOnce(r)
		if err != nil {
			log.Error("start failed", "err", err)
		} else if exit != nil {
			log.Warn("exited", "status", exit.String())
		} else {
			r.set(StateStopped)
			return // stopped on request
		}
		failed := err != nil || exit.Err != nil || exit.Status.Signaled() || exit.Status.ExitStatus() != 0
		if r.svc.Restart == RestartNever || (r.svc.Restart == RestartOnFailure && !failed) {
			if failed {
				r.set(StateFailed)
			} else {
				r.set(StateStopped)
			}
			<-r.stop
			return
		}
		delay = s.backoff.next(delay, time.Since(started))
		r.set(StateBackoff)
		log.Info("restarting after backoff", "delay", delay)
		select {
		case <-time.After(delay):
		case <-r.stop:
			r.set(StateStopped)
			return
		}
	}
}

// runOnce starts the service and waits until it exits (exit set) or is
// stopped on request (both nil).
func (s *Supervisor) runOnce(r *runner) (*Exit, error) {
	cmd := exec.Command(r.svc.Path, r.svc.Args...)
	cmd.Env = r.svc.Env
	cmd.Dir = r.svc.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if r.svc.Output != nil {
		// Give the child a real pipe so no copying goroutine is tied to
		// exec.Cmd.Wait, which a reaping PID 1 never calls.
		pr, pw, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = pw, pw
		go func() {
			io.Copy(r.svc.Output, pr)
			pr.Close()
		}()
		defer pw.Close()
	}
	exits, err := s.starter.Start(cmd)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.proc = cmd.Process
	r.state = StateRunning
	r.mu.Unlock()
	select {
	case e := <-exits:
		return &e, nil
	case <-r.stop:
		s.terminate(r, exits)
		return nil, nil
	}
}

// terminate sends the stop signal to the service's process group, then
// SIGKILL after the timeout.
func (s *Supervisor) terminate(r *runner, exits <-chan Exit) {
	r.set(StateStopping)
	sig, timeout := r.svc.StopSignal, r.svc.StopTimeout
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	pgid := r.proc.Pid
	syscall.Kill(-pgid, sig)
	select {
	case <-exits:
	case <-time.After(timeout):
		s.log.Warn("stop timed out, killing", "service", r.svc.Name, "timeout", timeout)
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-exits
	}
}

// Stop stops every service, the last started first, and waits for them.
func (s *Supervisor) Stop(ctx context.Context) error {
	s.mu.Lock()
	s.stopping = true
	runners := append([]*runner(nil), s.runners...)
	s.mu.Unlock()
	for i := len(runners) - 1; i >= 0; i-- {
		r := runners[i]
		close(r.stop)
		select {
		case <-r.done:
		case <-ctx.Done():
			return fmt.Errorf("stop %s: %w", r.svc.Name, ctx.Err())
		}
	}
	return nil
}
