package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// step is one named boot step. A step that is not fatal logs its error and
// the boot goes on without it.
type step struct {
	name  string
	run   func() error
	fatal bool
}

// record is a step as it ran, times measured from the kernel's start.
type record struct {
	Name     string        `json:"name"`
	Start    time.Duration `json:"start"`
	Duration time.Duration `json:"duration"`
	Err      string        `json:"err,omitempty"`
}

// timelineEnv carries stage 1's records to stage 2 across the exec.
const timelineEnv = "CAIRN_BOOT_TIMELINE"

// sinceBoot is the time since the kernel started (CLOCK_BOOTTIME).
func sinceBoot() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// runSteps runs steps in order, appending each to the timeline. It stops at
// the first fatal error and returns it.
func runSteps(timeline *[]record, steps []step) error {
	for _, s := range steps {
		start := sinceBoot()
		slog.Info(s.name, "at", start.Round(time.Millisecond))
		err := s.run()
		r := record{Name: s.name, Start: start, Duration: sinceBoot() - start}
		if err != nil {
			r.Err = err.Error()
		}
		*timeline = append(*timeline, r)
		if err != nil {
			if s.fatal {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			slog.Warn(s.name+" failed, going on", "err", err)
		}
	}
	return nil
}

// inheritTimeline reads stage 1's records from the environment and clears it
// so that services do not inherit it.
func inheritTimeline() []record {
	var recs []record
	if v := os.Getenv(timelineEnv); v != "" {
		if err := json.Unmarshal([]byte(v), &recs); err != nil {
			slog.Warn("stage 1 timeline unreadable", "err", err)
		}
		os.Unsetenv(timelineEnv)
	}
	return recs
}
