// Package backoff is the delay schedule of Cairn's retry loops: a delay
// that starts at Initial and doubles after each failure up to Max, with up
// to a fraction Jitter more at random, and a Clock to wait it out on.
//
// Use one Backoff value per loop: call Next (or Wait) after each failure
// and Reset after a success.
//
//	b := backoff.Backoff{Initial: time.Second, Max: 30 * time.Second, Jitter: 0.2}
//	for {
//		if err := try(ctx); err == nil {
//			return nil
//		}
//		if err := b.Wait(ctx); err != nil {
//			return err
//		}
//	}
//
// The jitter is added, never taken away: a delay is between the doubling
// schedule and Jitter more than it. Nodes that lost the API server or a
// service together are still spread out (up to a fifth of the delay, with
// Jitter 0.2), while the schedule stays a floor: a failing peer is never
// retried sooner than the schedule says, which "full jitter" (a delay
// anywhere in [0, d)) would allow, and tests can assert lower bounds.
//
// The domain rules of Kubernetes (the kubelet's CrashLoopBackOff and image
// pull backoff) keep their own shape in agent/kubelet/pods.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Clock is a source of time, replaceable so tests can drive delays.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives the time once d has passed.
	After(d time.Duration) <-chan time.Time
}

// RealClock is the system's clock.
var RealClock Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Backoff is a doubling delay with jitter. The zero value of each optional
// field means: no jitter, the real clock, the global random source.
type Backoff struct {
	Initial, Max time.Duration
	// Jitter is the fraction of a delay that may be added at random: 0.2
	// makes a delay d fall in [d, 1.2d].
	Jitter float64
	Clock  Clock      // for Wait; RealClock if nil
	Rand   *rand.Rand // for the jitter; math/rand/v2's global source if nil

	cur time.Duration // the last delay without jitter, 0 after a reset
}

// Next returns the delay after one more failure: Initial after the first,
// twice the last up to Max after each other, plus the jitter.
func (b *Backoff) Next() time.Duration {
	b.cur = min(max(2*b.cur, b.Initial), b.Max)
	n := int64(float64(b.cur)*b.Jitter) + 1
	if b.Jitter <= 0 || n <= 1 {
		return b.cur
	}
	var j int64
	if b.Rand != nil {
		j = b.Rand.Int64N(n)
	} else {
		j = rand.Int64N(n)
	}
	return b.cur + time.Duration(j)
}

// Reset starts the schedule over after a success; it reports whether there
// were failures since the last reset.
func (b *Backoff) Reset() bool {
	failed := b.cur != 0
	b.cur = 0
	return failed
}

// Wait waits the Next delay on b's Clock, or until ctx ends, whose error it
// then returns.
func (b *Backoff) Wait(ctx context.Context) error {
	return Sleep(ctx, b.clock(), b.Next())
}

func (b *Backoff) clock() Clock {
	if b.Clock == nil {
		return RealClock
	}
	return b.Clock
}

// Sleep waits d on c, or until ctx ends, whose error it then returns.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.After(d):
		return nil
	}
}
