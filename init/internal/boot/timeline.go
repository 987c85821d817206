// Package boot holds what both stages of Cairn's init share: sequences of
// named steps and the timeline they are recorded in, the console log
// handler, kernel module loading and mounting, the recovering goroutine
// helper, and the fatal-error path.
package boot

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/supervisor/safe"
)

// Step is one named step of a sequence. A step that is not fatal logs its
// error and the sequence goes on without it.
type Step struct {
	Name  string
	Run   func() error
	Fatal bool
}

// Sequence is what PID 1 does in one phase of the node's life (stage 1,
// the boot, the shutdown), as an ordered list of named steps, each timed
// into a Timeline.
type Sequence struct {
	Name  string
	Steps []Step
}

// ErrStopped is returned by Sequence.Run when it was told to stop before a
// step.
var ErrStopped = errors.New("stopped")

// Run runs the steps in order, recording each in tl. It stops at the first
// fatal error and returns it, or before the next step once stop is closed
// (ErrStopped; a nil stop never closes). A step that panics has failed with
// the panic as its error. No lock is held while a step runs: tl can be read
// meanwhile.
func (seq Sequence) Run(tl *Timeline, stop <-chan struct{}) error {
	for _, s := range seq.Steps {
		select {
		case <-stop:
			slog.Info(seq.Name+" stopped", "before", s.Name)
			return ErrStopped
		default:
		}
		start := SinceBoot()
		slog.Info(s.Name, "at", start.Round(time.Millisecond))
		err := Catch(s.Name, s.Run)
		r := Record{Name: s.Name, Start: start, Duration: SinceBoot() - start}
		if err != nil {
			r.Err = err.Error()
		}
		tl.Add(r)
		if err != nil {
			if s.Fatal {
				return fmt.Errorf("%s: %w", s.Name, err)
			}
			slog.Warn(s.Name+" failed, going on", "err", err)
		}
	}
	return nil
}

// Record is a step as it ran, times measured from the kernel's start.
type Record struct {
	Name     string        `json:"name"`
	Start    time.Duration `json:"start"`
	Duration time.Duration `json:"duration"`
	Err      string        `json:"err,omitempty"`
}

// Timeline is every step run since the kernel started, in order of start:
// stage 1's, the boot's, work done beside them (a DHCP exchange), the
// shutdown's. It is safe for concurrent use.
type Timeline struct {
	mu      sync.Mutex
	recs    []Record
	observe func(Record)
}

// Observe makes f see each record added from now on, once it is added.
func (t *Timeline) Observe(f func(Record)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.observe = f
}

// NewTimeline returns a timeline holding recs, records of an earlier stage.
func NewTimeline(recs []Record) *Timeline { return &Timeline{recs: slices.Clone(recs)} }

// Add records r in order of start: a step of a sequence, or work done in
// the background that started earlier.
func (t *Timeline) Add(r Record) {
	t.mu.Lock()
	i := sort.Search(len(t.recs), func(i int) bool { return t.recs[i].Start > r.Start })
	t.recs = slices.Insert(t.recs, i, r)
	f := t.observe
	t.mu.Unlock()
	if f != nil {
		f(r)
	}
}

// Records returns a copy of the records so far.
func (t *Timeline) Records() []Record {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.recs)
}

// TimelineEnv carries stage 1's records to stage 2 across the exec.
const TimelineEnv = "CAIRN_BOOT_TIMELINE"

// SinceBoot is the time since the kernel started (CLOCK_BOOTTIME).
func SinceBoot() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// InheritTimeline reads stage 1's records from the environment and clears it
// so that services do not inherit it.
func InheritTimeline() []Record {
	var recs []Record
	if v := os.Getenv(TimelineEnv); v != "" {
		if err := json.Unmarshal([]byte(v), &recs); err != nil {
			slog.Warn("stage 1 timeline unreadable", "err", err)
		}
		os.Unsetenv(TimelineEnv)
	}
	return recs
}

// Catch runs f and returns its error, or the panic it raised as an error,
// its stack logged: PID 1 must not die of a bug in one of its parts.
func Catch(name string, f func() error) error { return safe.Catch(slog.Default(), name, f) }

// Go runs f in a goroutine of its own that a panic cannot take PID 1 down
// with: every goroutine of init is started with it.
func Go(name string, f func()) { safe.Go(slog.Default(), name, f) }
