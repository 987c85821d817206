package kubelet

import (
	"context"
	"log/slog"
	"time"

	"github.com/cairn-os/cairn/internal/backoff"
)

// newBackoff is the delay schedule after failed calls to the API server or
// the runtime: min doubling after each failure up to max, with up to a
// fifth more at random so that nodes that lost the API server together do
// not come back in step.
func newBackoff(min, max time.Duration) backoff.Backoff {
	return backoff.Backoff{Initial: min, Max: max, Jitter: 0.2}
}

// sleep waits d, or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// retry calls f until it returns nil, logging each failure and waiting as
// b says; it returns ctx's error if ctx ends first.
func retry(ctx context.Context, log *slog.Logger, what string, b backoff.Backoff, f func(context.Context) error) error {
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d := b.Next()
		log.Warn("cannot "+what+"; retrying", "err", err, "in", d.Round(time.Millisecond))
		if !sleep(ctx, d) {
			return ctx.Err()
		}
	}
}
