package kubelet

import (
	"context"
	"time"

	"github.com/cairn-os/cairn/internal/backoff"
)

// newBackoff is the delay schedule of the pod loop after failed calls to
// the API server or the runtime: min doubling after each failure up to
// max, with up to a fifth more at random so that nodes that lost the API
// server together do not come back in step.
func newBackoff(min, max time.Duration) backoff.Backoff {
	return backoff.Backoff{Initial: min, Max: max, Jitter: 0.2}
}

// sleep waits d, or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	return backoff.Sleep(ctx, backoff.RealClock, d) == nil
}
