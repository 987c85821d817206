package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"sync"
	"testing"
	"time"
)

// TestMain lets the test binary serve as a helper process for the tests:
// with SUPERVISOR_HELPER set it plays that part instead of running tests.
func TestMain(m *testing.M) {
	switch os.Getenv("SUPERVISOR_HELPER") {
	case "":
		os.Exit(m.Run())
	case "listen":
		// listen PATH DELAY: after DELAY, accept connections on the unix
		// socket PATH until killed.
		delay, err := time.ParseDuration(os.Args[2])
		if err != nil {
			panic(err)
		}
		time.Sleep(delay)
		os.Remove(os.Args[1])
		l, err := net.Listen("unix", os.Args[1])
		if err != nil {
			panic(err)
		}
		for {
			c, err := l.Accept()
			if err != nil {
				panic(err)
			}
			c.Close()
		}
	}
}

// listener is a Service that accepts connections on a unix socket at sock
// once delay has passed.
func listener(name, sock string, delay time.Duration) Service {
	return Service{
		Name:  name,
		Path:  os.Args[0],
		Args:  []string{sock, delay.String()},
		Env:   append(os.Environ(), "SUPERVISOR_HELPER=listen"),
		Ready: UnixSocketProbe(sock),
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// syncBuffer is a bytes.Buffer safe for concurrent use, to capture logs.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// status returns the named service's status.
func status(t *testing.T, s *Supervisor, name string) ServiceStatus {
	t.Helper()
	for _, st := range s.Status() {
		if st.Name == name {
			return st
		}
	}
	t.Fatalf("Status() has no service %q", name)
	return ServiceStatus{}
}

// waitState waits until the named service is in state want.
func waitState(t *testing.T, s *Supervisor, name string, want State) ServiceStatus {
	t.Helper()
	var st ServiceStatus
	waitFor(t, fmt.Sprintf("%s to be %s", name, want), func() bool {
		st = status(t, s, name)
		return st.State == want
	})
	return st
}

// stop stops s, failing the test if that takes more than 10 s.
func stop(t *testing.T, s *Supervisor) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Fatalf("Stop() = %v, want nil", err)
	}
}

// fakeClock is a Clock whose time moves only when the test says.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Time
	d  time.Duration
	ch chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.timers = append(c.timers, fakeTimer{at: c.now.Add(d), d: d, ch: ch})
	return ch
}

// Advance moves time on by d, firing the timers that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	var left []fakeTimer
	for _, t := range c.timers {
		if t.at.After(c.now) {
			left = append(left, t)
			continue
		}
		t.ch <- c.now
	}
	c.timers = left
}

// waitTimer waits until one timer is pending and returns its duration.
func (c *fakeClock) waitTimer(t *testing.T) time.Duration {
	t.Helper()
	var pending []time.Duration
	waitFor(t, "a pending timer", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		pending = pending[:0]
		for _, tm := range c.timers {
			pending = append(pending, tm.d)
		}
		return len(pending) > 0
	})
	if len(pending) != 1 {
		sort.Slice(pending, func(i, j int) bool { return pending[i] < pending[j] })
		t.Fatalf("pending timers = %v, want one", pending)
	}
	return pending[0]
}
