package supervisor

import (
	"context"
	"io"
	"syscall"
	"time"

	"github.com/cairn-os/cairn/internal/backoff"
	"github.com/opencontainers/cgroups"
)

// Policy says when a service that exited on its own is started again.
type Policy int

const (
	RestartAlways    Policy = iota // whatever the exit status
	RestartOnFailure               // unless it exited with status 0
	RestartNever
)

// State of a service.
type State string

const (
	StateWaiting  State = "Waiting"  // for Start, or for a dependency to be Ready
	StateStarting State = "Starting" // being launched
	StateRunning  State = "Running"  // launched, not yet ready
	StateReady    State = "Ready"    // its probe succeeded, or it has none
	StateStopping State = "Stopping" // stop signal sent
	StateStopped  State = "Stopped"  // stopped on request, or exited and not restarted
	StateFailed   State = "Failed"   // failed and its policy says not to restart
	StateBackoff  State = "Backoff"  // failed or exited, restarting after a delay
)

// Service describes one supervised service.
type Service struct {
	Name string

	// The process to run: Path with Args (not including argv[0]), Env (the
	// supervisor's environment when nil) and working directory Dir.
	Path string
	Args []string
	Env  []string
	Dir  string
	// Launcher, if set, starts each run instead of Path, Args, Env and Dir.
	Launcher Launcher

	// DependsOn names the services that must be Ready before this one
	// starts; they are stopped after it.
	DependsOn []string
	// StopBefore names services that Stop stops only once this one has
	// stopped, though this one does not wait for them to start: the
	// agent ends the pods of containerd before containerd goes.
	StopBefore []string
	// Ready is polled after each start until it succeeds; nil means Ready
	// as soon as Running.
	Ready Probe
	// OnReady are run in order, in the background, each time the service
	// becomes Ready; see Action.
	OnReady []Action
	Restart Policy
	// StopSignal (default SIGTERM) is sent to the main process on stop;
	// after StopTimeout (default 10 s) every process of the service is
	// killed.
	StopSignal  syscall.Signal
	StopTimeout time.Duration

	// Cgroup is the service's cgroup, a path below Options.CgroupRoot such
	// as system/containerd; empty runs it in the supervisor's cgroup.
	Cgroup string
	// Resources are the limits set on Cgroup. CpuShares is not converted:
	// use CpuWeight.
	Resources *cgroups.Resources
	// OOMScoreAdj, if set, is written to the main process's
	// /proc/<pid>/oom_score_adj after each start.
	OOMScoreAdj *int

	// LogFile is the name of the service's log file in Options.LogDir;
	// empty keeps its output in memory only.
	LogFile string
	// Output, if set, also receives the output, one whole line per Write.
	// A slow Output slows the service's writes.
	Output io.Writer
}

// Action is work done for a service each time it becomes Ready, such as
// putting an image into a container runtime that has just started. It runs
// again after each restart, so it must be idempotent. A failure (an error,
// a panic, the timeout) is logged and noted in the service's logs with the
// action's name; the service stays Ready.
type Action struct {
	Name string
	Run  func(ctx context.Context) error
	// Timeout bounds each run (default defaultActionTimeout); ctx ends
	// sooner if the service's run ends.
	Timeout time.Duration
}

// defaultActionTimeout bounds an Action that sets no Timeout.
const defaultActionTimeout = time.Minute

// ServiceStatus is a service's state at one moment.
type ServiceStatus struct {
	Name  string
	State State
	// Reason says why it is in State: the exit status or start error that
	// put it in Backoff or Failed, the dependencies it waits for, why it is
	// not ready yet.
	Reason   string
	Restarts int
	// LastExit is how the last run ended, "" before the first ended.
	LastExit  string
	Since     time.Time // of the last state change
	StartedAt time.Time // of the current or last run
	Pid       int       // of the current run's main process, 0 if none
	Ready     bool
}

// restartBackoff is the restart delay schedule: 1 s doubling to 30 s, with
// up to a fifth more at random so that a service that failed on many nodes
// at once (a lost API server, a bad config) does not restart on all of them
// in step. A run that lasted restartReset starts it over.
var restartBackoff = backoff.Backoff{Initial: time.Second, Max: 30 * time.Second, Jitter: 0.2}

// restartReset is how long a healthy run lasts before the restart delay
// starts over.
const restartReset = time.Minute
