package supervisor

import (
	"fmt"
	"log/slog"

	"github.com/cairn-os/cairn/supervisor/safe"
)

// guard runs f, the code of a Launcher, Probe or Action, and turns a panic
// in it into an error, its stack logged to log: a bug in one service's
// plumbing fails that service, which backs off and starts again, instead of
// taking down the process that supervises everything (PID 1 on a node).
func guard(log *slog.Logger, what string, f func() error) error {
	err := safe.Catch(log, what, f)
	if pe, ok := err.(*safe.PanicError); ok {
		return fmt.Errorf("%s panicked: %v", what, pe.Value)
	}
	return err
}
