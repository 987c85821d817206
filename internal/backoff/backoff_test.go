package backoff

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestNextDoublesUpToMax(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 30 * time.Second}
	var got []time.Duration
	for range 8 {
		got = append(got, b.Next())
	}
	s := time.Second
	want := []time.Duration{s, 2 * s, 4 * s, 8 * s, 16 * s, 30 * s, 30 * s, 30 * s}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Next without jitter (-want +got):\n%s", diff)
	}
}

func TestInitialAboveMaxIsCapped(t *testing.T) {
	b := Backoff{Initial: time.Minute, Max: 30 * time.Second}
	if got := b.Next(); got != 30*time.Second {
		t.Errorf("Next with Initial 1m, Max 30s = %s, want 30s", got)
	}
}

func TestResetStartsOver(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 30 * time.Second}
	if b.Reset() {
		t.Error("Reset before any failure = true, want false")
	}
	b.Next()
	b.Next()
	if !b.Reset() {
		t.Error("Reset after two failures = false, want true")
	}
	if got := b.Next(); got != time.Second {
		t.Errorf("Next after Reset = %s, want 1s", got)
	}
}

func TestJitterIsWithinTheFraction(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 30 * time.Second, Jitter: 0.2, Rand: rand.New(rand.NewPCG(1, 2))}
	base := time.Second
	spread := false
	for i := range 200 {
		got := b.Next()
		if got < base || got > base+base/5 {
			t.Fatalf("Next #%d with Jitter 0.2 = %s, want within [%s, %s]", i, got, base, base+base/5)
		}
		if got != base {
			spread = true
		}
		b.Reset()
	}
	if !spread {
		t.Error("200 delays with Jitter 0.2 were all exactly 1s, want some jitter")
	}
}

func TestJitterIsDeterministicWithASeededRand(t *testing.T) {
	seq := func() []time.Duration {
		b := Backoff{Initial: time.Second, Max: time.Minute, Jitter: 0.5, Rand: rand.New(rand.NewPCG(7, 7))}
		var ds []time.Duration
		for range 6 {
			ds = append(ds, b.Next())
		}
		return ds
	}
	if diff := cmp.Diff(seq(), seq()); diff != "" {
		t.Errorf("two runs with the same seed differ (-first +second):\n%s", diff)
	}
}

// fakeClock records the delays it is asked to wait and fires at once.
type fakeClock struct{ waits []time.Duration }

func (c *fakeClock) Now() time.Time { return time.Time{} }
func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.waits = append(c.waits, d)
	ch := make(chan time.Time, 1)
	ch <- time.Time{}
	return ch
}

func TestWaitUsesTheClock(t *testing.T) {
	c := &fakeClock{}
	b := Backoff{Initial: 100 * time.Millisecond, Max: 300 * time.Millisecond, Clock: c}
	for range 4 {
		if err := b.Wait(context.Background()); err != nil {
			t.Fatalf("Wait = %v, want nil", err)
		}
	}
	ms := time.Millisecond
	if diff := cmp.Diff([]time.Duration{100 * ms, 200 * ms, 300 * ms, 300 * ms}, c.waits); diff != "" {
		t.Errorf("delays waited on the clock (-want +got):\n%s", diff)
	}
}

func TestWaitEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := Backoff{Initial: time.Hour, Max: time.Hour}
	if err := b.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait on a cancelled context = %v, want %v", err, context.Canceled)
	}
}
