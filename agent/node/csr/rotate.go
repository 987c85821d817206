package csr

import (
	"context"
	"crypto/x509"
	"log/slog"
	"math/big"
	"time"

	"github.com/cairn-os/cairn/internal/backoff"
)

// Deadline is when leaf is renewed: at 70 to 90 % of its lifetime, as
// the kubelet renews its own, which leaves at least a tenth of it for the
// renewal and spreads the renewals of nodes whose certificates were
// issued together. The fraction comes from the serial number, which the
// signer draws at random, so that it stays the same for one certificate
// across restarts of the agent.
func Deadline(leaf *x509.Certificate) time.Time {
	var n int64
	if leaf.SerialNumber != nil {
		n = new(big.Int).Mod(leaf.SerialNumber, big.NewInt(1000)).Int64() // Mod is never negative
	}
	// 70 % + n/1000 of 20 %, in integers: (3500+n)/5000.
	return leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 5000 * time.Duration(3500+n))
}

// Rotator renews a certificate whenever it passes its Deadline or is
// stale, retrying a failed renewal with backoff, until its context ends.
type Rotator struct {
	// What names the certificate in the logs.
	What string
	// Current returns the certificate in use; nil means none from the
	// cluster yet: it is requested at once.
	Current func() *x509.Certificate
	// Renew gets a new certificate and makes it current.
	Renew func(ctx context.Context) error
	// Stale, if set, tells whether the current certificate no longer
	// fits (the node's addresses changed): it is renewed then.
	Stale func(*x509.Certificate) bool
	// Wake, if set, makes the rotator look again at once: Stale may have
	// changed its mind.
	Wake <-chan struct{}
	// Now is the clock; Check, if positive, bounds the time between two
	// looks at it, so that a clock that jumps (a test's) is seen.
	Now   func() time.Time
	Check time.Duration
	// Checked, if set, is called at each look, which tells a test that a
	// renewal had its chances.
	Checked func()
	Log     *slog.Logger
}

// Run renews until ctx ends.
func (r *Rotator) Run(ctx context.Context) {
	b := backoff.Backoff{Initial: time.Second, Max: 5 * time.Minute, Jitter: 0.2}
	for {
		if r.Checked != nil {
			r.Checked()
		}
		leaf := r.Current()
		if leaf != nil && !r.due(leaf) {
			wait := Deadline(leaf).Sub(r.Now())
			if r.Check > 0 {
				wait = min(wait, r.Check)
			}
			if r.sleep(ctx, wait) != nil {
				return
			}
			continue
		}
		err := r.Renew(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			b.Reset()
			continue
		}
		d := b.Next()
		args := []any{"err", err, "in", d.Round(time.Millisecond)}
		if leaf != nil {
			args = append(args, "expires", leaf.NotAfter)
		}
		r.Log.Warn("cannot renew the "+r.What+"; retrying", args...)
		// Not woken early: a change of addresses does not make a signer
		// that refuses more willing.
		if backoff.Sleep(ctx, backoff.RealClock, d) != nil {
			return
		}
	}
}

func (r *Rotator) due(leaf *x509.Certificate) bool {
	return !r.Now().Before(Deadline(leaf)) || (r.Stale != nil && r.Stale(leaf))
}

// sleep waits d, or until Wake receives or ctx ends.
func (r *Rotator) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-r.Wake: // a nil channel never receives
	case <-t.C:
	}
	return nil
}
