// Package boot holds what both stages of Cairn's init share: boot steps
// and their timeline, the console log handler, kernel module loading and
// mounting, and the fatal-error path.
package boot

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Step is one named boot step. A step that is not fatal logs its error and
// the boot goes on without it.
type Step struct {
	Name  string
	Run   func() error
	Fatal bool
}

// Record is a step as it ran, times measured from the kernel's start.
type Record struct {
	Name     string        `json:"name"`
	Start    time.Duration `json:"start"`
	Duration time.Duration `json:"duration"`
	Err      string        `json:"err,omitempty"`
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

// RunSteps runs steps in order, appending each to the timeline. It stops at
// the first fatal error and returns it. A step that panics has failed with
// the panic as its error.
func RunSteps(timeline *[]Record, steps []Step) error {
	for _, s := range steps {
		start := SinceBoot()
		slog.Info(s.Name, "at", start.Round(time.Millisecond))
		err := Catch(s.Name, s.Run)
		r := Record{Name: s.Name, Start: start, Duration: SinceBoot() - start}
		if err != nil {
			r.Err = err.Error()
		}
		*timeline = append(*timeline, r)
		if err != nil {
			if s.Fatal {
				return fmt.Errorf("%s: %w", s.Name, err)
			}
			slog.Warn(s.Name+" failed, going on", "err", err)
		}
	}
	return nil
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
