package kubelet

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"
)

// backoff is a delay that starts at min and doubles after each failure up
// to max, with up to a fifth more at random so that nodes that lost the
// API server together do not come back in step.
type backoff struct {
	min, max time.Duration
	cur      time.Duration // 0 before the first failure
}

// next returns the delay after one more failure.
func (b *backoff) next() time.Duration {
	b.cur = min(max(2*b.cur, b.min), b.max)
	return b.cur + rand.N(b.cur/5+1)
}

// reset starts over after a success; it reports whether there were
// failures since the last reset.
func (b *backoff) reset() bool {
	failed := b.cur != 0
	b.cur = 0
	return failed
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
func retry(ctx context.Context, log *slog.Logger, what string, b backoff, f func(context.Context) error) error {
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d := b.next()
		log.Warn("cannot "+what+"; retrying", "err", err, "in", d.Round(time.Millisecond))
		if !sleep(ctx, d) {
			return ctx.Err()
		}
	}
}
