package stage2

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/beevik/ntp"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/internal/backoff"
)

const (
	// stepThreshold is the offset beyond which the clock is stepped, as
	// chrony's makestep and ntpd's step threshold do; smaller ones are
	// slewed, so that time never runs backwards for the services.
	stepThreshold = time.Second
	// minPoll and maxPoll bound the interval between polls of the NTP
	// servers (NTP's default minpoll 6 and maxpoll 10): it doubles after
	// each sync, to spare the servers as a steady clock needs less.
	minPoll, maxPoll = 64 * time.Second, 1024 * time.Second
	// ntpTimeout bounds one server's answer.
	ntpTimeout = 5 * time.Second
)

// clock is what the time keeper changes of the system clock, behind an
// interface so that no test changes the clock of the machine it runs on.
type clock interface {
	// step moves the clock by offset at once.
	step(offset time.Duration) error
	// slew runs the clock slightly fast or slow until it has moved by
	// offset.
	slew(offset time.Duration) error
}

// kernelClock is the system clock, corrected with adjtimex(2).
type kernelClock struct{}

func (kernelClock) step(offset time.Duration) error {
	// ADJ_SETOFFSET adds to the clock in the kernel: nothing is lost
	// between reading the time and setting it.
	tx := unix.Timex{Modes: unix.ADJ_SETOFFSET | unix.ADJ_NANO, Time: nanoTimeval(offset)}
	if _, err := unix.Adjtimex(&tx); err != nil {
		return fmt.Errorf("step the clock by %s: %w", offset, err)
	}
	return nil
}

// nanoTimeval is d as adjtimex's ADJ_NANO reads a time: seconds, negative
// for a step back, and nanoseconds in [0, 1e9) in the Usec field.
func nanoTimeval(d time.Duration) unix.Timeval {
	sec, nsec := int64(d/time.Second), int64(d%time.Second)
	if nsec < 0 {
		sec, nsec = sec-1, nsec+int64(time.Second)
	}
	return unix.Timeval{Sec: sec, Usec: nsec}
}

func (kernelClock) slew(offset time.Duration) error {
	// As adjtime(3): the kernel slews at 0.5 ms per second.
	tx := unix.Timex{Modes: unix.ADJ_OFFSET_SINGLESHOT, Offset: offset.Microseconds()}
	if _, err := unix.Adjtimex(&tx); err != nil {
		return fmt.Errorf("slew the clock by %s: %w", offset, err)
	}
	return nil
}

// timeKeeper keeps the clock in step with NTP servers (machine.time) and
// holds the state of the sync for Version.
type timeKeeper struct {
	clock clock
	// query asks one server, given as configured, for the time.
	query func(server string) (*ntp.Response, error)
	// wait times the polls: backoff.RealClock but in tests.
	wait backoff.Clock
	// changed wakes keep when the servers change, to poll them at once.
	changed chan struct{}

	mu      sync.Mutex
	servers []string
	state   *machine.TimeSync
}

func newTimeKeeper(servers []string, c clock) *timeKeeper {
	return &timeKeeper{
		servers: slices.Clone(servers),
		clock:   c,
		query: func(server string) (*ntp.Response, error) {
			return ntp.QueryWithOptions(server, ntp.QueryOptions{Timeout: ntpTimeout})
		},
		wait:    backoff.RealClock,
		changed: make(chan struct{}, 1),
		state:   &machine.TimeSync{},
	}
}

// setServers makes servers the ones the keeper polls, from now on: a
// machine config applied live. The sync starts afresh with them; with none
// the keeper rests.
func (k *timeKeeper) setServers(servers []string) {
	k.mu.Lock()
	k.servers = slices.Clone(servers)
	k.state = &machine.TimeSync{}
	k.mu.Unlock()
	select {
	case k.changed <- struct{}{}:
	default: // a change already waits to be seen
	}
}

// startTimeKeeper sets the clock from servers, if any, then keeps it in
// step in the background until stop is closed; Version reads the keeper.
// The error is the first poll's: the keeper goes on polling regardless.
func (n *node) startTimeKeeper(servers []string) error {
	k := newTimeKeeper(servers, kernelClock{})
	n.mu.Lock()
	n.timeKeeper = k
	n.mu.Unlock()
	var err error
	if len(servers) > 0 {
		err = k.poll()
	}
	boot.Go("time keeper", func() { k.keep(err == nil, n.stop) })
	return err
}

// poll asks the servers in order and corrects the clock by the offset of
// the first that gives a valid answer. The error names each server that
// did not.
func (k *timeKeeper) poll() error {
	k.mu.Lock()
	servers := k.servers
	k.mu.Unlock()
	if len(servers) == 0 {
		return nil
	}
	var errs []error
	for _, server := range servers {
		r, err := k.query(server)
		if err == nil {
			err = r.Validate() // a kiss of death, an unsynchronized server
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("NTP server %s: %w", server, err))
			continue
		}
		if err := k.correct(r.ClockOffset); err != nil {
			errs = append(errs, fmt.Errorf("NTP server %s: %w", server, err))
			break
		}
		if len(errs) > 0 {
			slog.Warn("NTP servers skipped", "err", errors.Join(errs...))
		}
		k.mu.Lock()
		k.state = &machine.TimeSync{Synced: true, Server: server, Offset: durationpb.New(r.ClockOffset), LastSync: timestamppb.Now()}
		k.mu.Unlock()
		return nil
	}
	err := errors.Join(errs...)
	k.mu.Lock()
	// What the last sync was stays, for the operator to see how old.
	k.state.Synced, k.state.Error = false, err.Error()
	k.mu.Unlock()
	return fmt.Errorf("clock not set: %w", err)
}

// correct steps the clock by offset when it is beyond stepThreshold, else
// slews it.
func (k *timeKeeper) correct(offset time.Duration) error {
	if offset > stepThreshold || offset < -stepThreshold {
		if err := k.clock.step(offset); err != nil {
			return err
		}
		slog.Info("clock stepped", "offset", offset)
		return nil
	}
	return k.clock.slew(offset)
}

// keep polls the servers until stop is closed: every minPoll at first,
// twice as long after each sync up to maxPoll, and after a failed poll
// again soon, backing off up to minPoll. New servers are polled at once,
// and the intervals start again; with none it waits for some.
func (k *timeKeeper) keep(synced bool, stop <-chan struct{}) {
	interval := minPoll
	retry := backoff.Backoff{Initial: 2 * time.Second, Max: minPoll, Jitter: 0.1}
	for {
		k.mu.Lock()
		none := len(k.servers) == 0
		k.mu.Unlock()
		var after <-chan time.Time // none: no poll until servers come
		if !none {
			wait := interval
			if !synced {
				wait = retry.Next()
			}
			k.mu.Lock()
			k.state.NextPoll = timestamppb.New(k.wait.Now().Add(wait))
			k.mu.Unlock()
			after = k.wait.After(wait)
		}
		changed := false
		select {
		case <-stop:
			return
		case <-k.changed:
			changed, interval = true, minPoll
			retry.Reset()
		case <-after:
		}
		err := k.poll()
		if changed {
			if err != nil {
				slog.Warn("NTP poll of the new servers failed", "err", err)
			}
			synced = err == nil
			continue
		}
		switch {
		case err != nil:
			slog.Warn("NTP poll failed", "err", err)
		case synced:
			interval = min(2*interval, maxPoll)
		default:
			retry.Reset()
			slog.Info("clock in step again")
		}
		synced = err == nil
	}
}

// timeSync returns the state of the sync, nil when no server is
// configured.
func (k *timeKeeper) timeSync() *machine.TimeSync {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.servers) == 0 {
		return nil
	}
	return proto.Clone(k.state).(*machine.TimeSync)
}
