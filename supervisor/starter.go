package supervisor

import (
	"fmt"
	"log/slog"
	"os/exec"
	"syscall"

	"github.com/cairn-os/cairn/supervisor/safe"
)

// Exit is how a process ended.
type Exit struct {
	Status syscall.WaitStatus
	Err    error // set when the status could not be collected
}

func (e Exit) String() string {
	switch {
	case e.Err != nil:
		return e.Err.Error()
	case e.Status.Signaled():
		return fmt.Sprintf("killed by signal %s", e.Status.Signal())
	default:
		return fmt.Sprintf("exit status %d", e.Status.ExitStatus())
	}
}

// Failed reports whether the process did not exit with status 0.
func (e Exit) Failed() bool {
	return e.Err != nil || e.Status.Signaled() || e.Status.ExitStatus() != 0
}

// Starter starts a process and reports its exit exactly once on the returned
// channel.
type Starter interface {
	Start(cmd *exec.Cmd) (<-chan Exit, error)
}

// DirectStarter waits for each process itself. Use it in any process that is
// not a PID 1 reaping all children.
type DirectStarter struct{}

// Start implements Starter.
func (DirectStarter) Start(cmd *exec.Cmd) (<-chan Exit, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := make(chan Exit, 1)
	safe.Go(slog.Default(), "wait for "+cmd.Path, func() {
		err := cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
			ch <- Exit{Status: ws}
			return
		}
		ch <- Exit{Err: err}
	})
	return ch, nil
}
