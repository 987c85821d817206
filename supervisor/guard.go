package supervisor

import (
	"fmt"
	"log/slog"
	"runtime/debug"
)

// guard runs f, the code of a Launcher or Probe, and turns a panic in it
// into an error, its stack logged to log: a bug in one service's plumbing
// fails that service, which backs off and starts again, instead of taking
// down the process that supervises everything (PID 1 on a node).
func guard(log *slog.Logger, what string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			log.Error("panic recovered", "in", what, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("%s panicked: %v", what, r)
		}
	}()
	return f()
}
