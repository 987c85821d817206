package supervisor

import (
	"context"
	"log/slog"
	"strings"
	"syscall"
	"time"

	"github.com/cairn-os/cairn/supervisor/safe"
)

const (
	defaultStopTimeout = 10 * time.Second
	// A probe is polled every firstProbe at first, backing off to
	// lastProbe; each check may take up to probeTimeout.
	firstProbe   = 100 * time.Millisecond
	lastProbe    = time.Second
	probeTimeout = 5 * time.Second
)

// run is the life of one service: wait for its dependencies, launch it,
// watch it become ready and end, and start it again as its policy says,
// until it is stopped.
func (s *Supervisor) run(sv *service) {
	var (
		delay = s.restartBackoff // this service's restart delays
		last  Instance           // the last run, to clean up after on stop
	)
	defer func() {
		if last != nil {
			s.cleanup(sv, last)
		}
		s.set(sv, StateStopped, "")
		close(sv.done)
	}()
	for first := true; ; first = false {
		if !s.waitDeps(sv) {
			return
		}
		if !first {
			s.mu.Lock()
			sv.status.Restarts++
			s.mu.Unlock()
		}
		s.set(sv, StateStarting, "")
		started := s.opts.Clock.Now()
		var inst Instance
		err := guard(sv.log, "launch", func() (err error) {
			inst, err = sv.launcher.Launch(sv.ctx, LaunchOptions{Output: sv.logs})
			return err
		})
		var reason string
		failed := true
		switch {
		case err != nil && sv.ctx.Err() != nil:
			return
		case err != nil:
			sv.logs.note("start failed: %v", err)
			sv.log.Warn("start failed", "err", err)
			reason = err.Error()
		default:
			last = inst
			e, how := s.watch(sv, inst)
			switch how {
			case stopped:
				last = nil
				return
			case restarted:
				last = nil
				delay.Reset()
				continue
			}
			reason, failed = e.String(), e.Failed()
			sv.logs.note("exited: %s", e)
			level := slog.LevelInfo
			if failed {
				level = slog.LevelWarn
			}
			sv.log.Log(sv.ctx, level, "exited", "status", reason)
		}

		if sv.spec.Restart == RestartNever || (sv.spec.Restart == RestartOnFailure && !failed) {
			state := StateStopped
			if failed {
				state = StateFailed
			}
			s.set(sv, state, reason)
			select {
			case <-sv.ctx.Done():
				return
			case ack := <-sv.restart:
				close(ack)
				delay.Reset()
				continue
			}
		}
		if s.opts.Clock.Now().Sub(started) >= restartReset {
			delay.Reset()
		}
		d := delay.Next()
		s.set(sv, StateBackoff, reason)
		sv.logs.note("restarting in %s", d.Round(time.Millisecond))
		select {
		case <-s.opts.Clock.After(d):
		case ack := <-sv.restart:
			close(ack)
			delay.Reset()
		case <-sv.ctx.Done():
			return
		}
	}
}

// How a watched run ended.
type ending int

const (
	exited    ending = iota // on its own
	stopped                 // stopped on request
	restarted               // stopped for a restart
)

// watch follows one run: Running, Ready once the probe succeeds, until it
// exits or is stopped.
func (s *Supervisor) watch(sv *service, inst Instance) (Exit, ending) {
	s.mu.Lock()
	sv.status.Pid = inst.Pid()
	sv.status.StartedAt = s.opts.Clock.Now()
	s.setLocked(sv, StateRunning, "")
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		sv.status.Pid = 0
		s.mu.Unlock()
	}()

	ctx, cancel := context.WithCancel(sv.ctx)
	defer cancel()
	// Without a probe a service is ready once launched: said here, not
	// through the channel, so a stop racing the select cannot skip Ready.
	var ready chan struct{}
	if sv.spec.Ready == nil {
		s.set(sv, StateReady, "")
		s.onReady(ctx, sv)
	} else {
		ready = make(chan struct{})
		safe.Go(sv.log, "readiness probe", func() { s.probe(ctx, sv, ready) })
	}
	for {
		select {
		case <-ready:
			s.set(sv, StateReady, "")
			s.onReady(ctx, sv)
			ready = nil
		case e := <-inst.Exited():
			s.lastExit(sv, e)
			return e, exited
		case <-sv.ctx.Done():
			s.stop(sv, inst, "stop requested")
			return Exit{}, stopped
		case ack := <-sv.restart:
			s.stop(sv, inst, "restart requested")
			close(ack)
			return Exit{}, restarted
		}
	}
}

// onReady runs the service's OnReady actions in order, in the background,
// until ctx (this run of the service) ends.
func (s *Supervisor) onReady(ctx context.Context, sv *service) {
	if len(sv.spec.OnReady) == 0 {
		return
	}
	safe.Go(sv.log, "ready actions", func() {
		for _, a := range sv.spec.OnReady {
			timeout := a.Timeout
			if timeout <= 0 {
				timeout = defaultActionTimeout
			}
			actx, cancel := context.WithTimeout(ctx, timeout)
			err := guard(sv.log, a.Name, func() error { return a.Run(actx) })
			cancel()
			switch {
			case ctx.Err() != nil:
				return // the run ended: the next Ready runs them again
			case err != nil:
				sv.logs.note("ready action %s failed: %v", a.Name, err)
				sv.log.Warn("ready action failed", "action", a.Name, "err", err)
			default:
				sv.log.Info("ready action done", "action", a.Name)
			}
		}
	})
}

// probe checks the service's readiness until it succeeds, then closes
// ready. The last failure is kept as the status's reason.
func (s *Supervisor) probe(ctx context.Context, sv *service, ready chan<- struct{}) {
	for interval := firstProbe; ; interval = min(interval*2, lastProbe) {
		cctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := guard(sv.log, "readiness probe", func() error { return sv.spec.Ready.Check(cctx, s.opts.Starter) })
		cancel()
		if err == nil {
			close(ready)
			return
		}
		s.mu.Lock()
		if ctx.Err() == nil && sv.status.State == StateRunning {
			sv.status.Reason = "not ready: " + err.Error()
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-s.opts.Clock.After(interval):
		}
	}
}

// stop ends a run: the stop signal, and after the stop timeout SIGKILL to
// every process of it; processes it leaves behind are killed too.
func (s *Supervisor) stop(sv *service, inst Instance, why string) {
	sig, timeout := sv.spec.StopSignal, sv.spec.StopTimeout
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	if timeout <= 0 {
		timeout = defaultStopTimeout
	}
	s.set(sv, StateStopping, why)
	sv.logs.note("stopping (%s): sending %s", why, sig)
	if err := inst.Signal(sig); err != nil {
		sv.log.Warn("stop signal failed", "signal", sig, "err", err)
	}
	var e Exit
	select {
	case e = <-inst.Exited():
		s.cleanup(sv, inst)
	case <-s.opts.Clock.After(timeout):
		sv.logs.note("still running after %s, killing every process", timeout)
		sv.log.Warn("stop timed out, killing", "timeout", timeout)
		s.cleanup(sv, inst)
		e = <-inst.Exited()
	}
	s.lastExit(sv, e)
}

// cleanup kills every process of a run.
func (s *Supervisor) cleanup(sv *service, inst Instance) {
	if err := inst.Kill(); err != nil {
		sv.log.Warn("kill failed", "err", err)
	}
}

// waitDeps waits until every dependency of sv is Ready; false means sv was
// stopped meanwhile.
func (s *Supervisor) waitDeps(sv *service) bool {
	for {
		if sv.ctx.Err() != nil {
			return false
		}
		s.mu.Lock()
		var waiting []string
		for _, d := range sv.spec.DependsOn {
			if s.services[d].status.State != StateReady {
				waiting = append(waiting, d)
			}
		}
		reason := "waiting for " + strings.Join(waiting, ", ")
		if len(waiting) > 0 && (sv.status.State != StateWaiting || sv.status.Reason != reason) {
			s.setLocked(sv, StateWaiting, reason)
		}
		changed := s.changed
		s.mu.Unlock()
		if len(waiting) == 0 {
			return true
		}
		select {
		case <-changed:
		case ack := <-sv.restart:
			close(ack)
		case <-sv.ctx.Done():
			return false
		}
	}
}

func (s *Supervisor) lastExit(sv *service, e Exit) {
	s.mu.Lock()
	sv.status.LastExit = e.String()
	s.mu.Unlock()
}

func (s *Supervisor) set(sv *service, state State, reason string) {
	s.mu.Lock()
	s.setLocked(sv, state, reason)
	s.mu.Unlock()
}

// setLocked records a state change and publishes it. s.mu is held.
func (s *Supervisor) setLocked(sv *service, state State, reason string) {
	now := s.opts.Clock.Now()
	sv.status.State, sv.status.Reason, sv.status.Since = state, reason, now
	sv.status.Ready = state == StateReady
	s.events.Publish(Event{Service: sv.spec.Name, State: state, Time: now, Reason: reason})
	close(s.changed)
	s.changed = make(chan struct{})
	sv.log.Debug("state", "state", state, "reason", reason)
}
