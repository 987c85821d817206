package pods

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The kubelet's CrashLoopBackOff: the first restart after a container
// exits waits BackoffInitial, each further one twice as long up to
// BackoffMax; a run of at least BackoffReset starts the count over.
const (
	BackoffInitial = 10 * time.Second
	BackoffMax     = 5 * time.Minute
	BackoffReset   = 10 * time.Minute
)

// Run is one finished run of a container: one CRI container, one attempt.
type Run struct {
	StartedAt, FinishedAt time.Time
}

// RestartDelay returns how long after the last of runs (oldest first, all
// finished) the container may start again: BackoffInitial after the
// first exit, doubling with each exit up to BackoffMax. A run that lasted
// BackoffReset or longer forgives the exits before it: its own exit counts
// as the first.
func RestartDelay(runs []Run) time.Duration {
	exits := 0
	for _, r := range runs {
		if r.FinishedAt.Sub(r.StartedAt) >= BackoffReset {
			exits = 1
		} else {
			exits++
		}
	}
	d := BackoffInitial
	for i := 1; i < exits && d < BackoffMax; i++ {
		d *= 2
	}
	return min(d, BackoffMax)
}

// NextStart returns when a container with these finished runs may start
// again: the end of the last run plus RestartDelay. With no runs it may
// start at once (the zero time).
func NextStart(runs []Run) time.Time {
	if len(runs) == 0 {
		return time.Time{}
	}
	return runs[len(runs)-1].FinishedAt.Add(RestartDelay(runs))
}

// Restarts reports whether a container that exited with exitCode is
// started again under the pod's restart policy (Always when empty).
func Restarts(policy corev1.RestartPolicy, exitCode int32) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return exitCode != 0
	default:
		return true
	}
}
