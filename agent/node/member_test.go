package node

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cairn-os/cairn/internal/backoff"
)

// fakeClock is a clock whose time moves only by the delays waited on it,
// at once.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	waited []time.Duration
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.waited = append(c.waited, d)
	ch := make(chan time.Time, 1)
	ch <- c.now
	return ch
}

// advance moves the clock by d, as a long run of a component would.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestRunComponent wants a failing component started again after a
// doubling delay, a long run to start the delays over, and a component
// that returns nil left alone.
func TestRunComponent(t *testing.T) {
	clock := &fakeClock{now: time.Unix(0, 0)}
	b := backoff.Backoff{Initial: time.Second, Max: 4 * time.Second, Clock: clock}
	runs := 0
	c := Component{Name: "flaky", Run: func(ctx context.Context, m *Member) error {
		runs++
		switch runs {
		case 4:
			clock.advance(5 * time.Second) // longer than the longest delay
		case 6:
			return nil
		}
		return errors.New("broken")
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runComponent(context.Background(), nil, c, slog.New(slog.DiscardHandler), b)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("runComponent did not return 10 s after the component returned nil")
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, time.Second, 2 * time.Second}
	if runs != 6 || !slices.Equal(clock.waited, want) {
		t.Errorf("runComponent ran the component %d times, waiting %v; want 6 times, waiting %v", runs, clock.waited, want)
	}
}

// TestRunComponentStops wants runComponent to return when its context
// ends, without waiting out the delay.
func TestRunComponentStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{}, 1)
	c := Component{Name: "blocked", Run: func(ctx context.Context, m *Member) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runComponent(ctx, nil, c, slog.New(slog.DiscardHandler), retryBackoff())
	}()
	<-started
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("runComponent did not return 10 s after its context ended")
	}
}
