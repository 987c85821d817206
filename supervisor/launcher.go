package supervisor

import (
	"context"
	"io"
	"syscall"
)

// Launcher starts one run of a service. The supervisor calls Launch for
// every start and restart; restart policy, readiness, cgroup placement and
// the OOM score are added around it, so a Launcher only has to start
// something and report how it ends.
type Launcher interface {
	Launch(ctx context.Context, opts LaunchOptions) (Instance, error)
}

// LaunchOptions is what the supervisor hands to one run.
type LaunchOptions struct {
	// Output receives the run's stdout and stderr.
	Output io.Writer
	// Cgroup, when set, is the cgroup v2 directory the run should start in
	// (for example /sys/fs/cgroup/system/containerd). The supervisor has
	// created it and set its limits, and moves Instance.Pid into it after
	// Launch; a Launcher that can start the run inside it directly avoids
	// the moment in which a first child could escape.
	Cgroup string
}

// Instance is one run of a service.
type Instance interface {
	// Pid is the main process of the run.
	Pid() int
	// Exited receives how the main process ended, once. The supervisor is
	// its only reader.
	Exited() <-chan Exit
	// Signal sends sig to the main process.
	Signal(sig syscall.Signal) error
	// Kill sends SIGKILL to every process of the run. It is also called
	// once the main process has ended, to end whatever the run left behind.
	Kill() error
}
