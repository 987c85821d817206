package csr

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/poll"
)

// TestRotator runs a Rotator on a clock the test moves: nothing before
// the deadline, one renewal at it, one when the certificate goes stale,
// and a failed renewal tried again.
func TestRotator(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var (
		mu       sync.Mutex
		now      = t0.Add(time.Hour)
		leaf     = &x509.Certificate{SerialNumber: big.NewInt(500), NotBefore: t0, NotAfter: t0.Add(100 * time.Hour)}
		stale    bool
		failNext bool
		renewals int
	)
	var checks atomic.Uint64
	wake := make(chan struct{}, 1)
	r := &Rotator{
		What: "test certificate",
		Current: func() *x509.Certificate {
			mu.Lock()
			defer mu.Unlock()
			return leaf
		},
		Renew: func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			if failNext {
				failNext = false
				return errors.New("denied: TestDenied: no")
			}
			renewals++
			leaf = &x509.Certificate{SerialNumber: big.NewInt(500), NotBefore: now, NotAfter: now.Add(100 * time.Hour)}
			stale = false
			return nil
		},
		Stale: func(*x509.Certificate) bool {
			mu.Lock()
			defer mu.Unlock()
			return stale
		},
		Wake:    wake,
		Now:     func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		Check:   10 * time.Millisecond,
		Checked: func() { checks.Add(1) },
		Log:     slog.New(slog.DiscardHandler),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()

	count := func() int { mu.Lock(); defer mu.Unlock(); return renewals }
	// waitChecks waits until the rotator looked at the clock n more times.
	waitChecks := func(n uint64) {
		t.Helper()
		from := checks.Load()
		poll.Until(t, 5*time.Second, "looks at the clock", func() error {
			if checks.Load() < from+n {
				return errors.New("not yet")
			}
			return nil
		})
	}
	want := func(n int, what string) {
		t.Helper()
		poll.Until(t, 5*time.Second, what, func() error {
			if got := count(); got != n {
				return fmt.Errorf("%d renewals", got)
			}
			return nil
		})
	}

	waitChecks(5)
	if n := count(); n != 0 {
		t.Fatalf("%d renewals before the deadline, want 0", n)
	}
	mu.Lock()
	now = t0.Add(80 * time.Hour) // the deadline of serial 500
	mu.Unlock()
	want(1, "a renewal at the deadline")
	waitChecks(5)
	if n := count(); n != 1 {
		t.Fatalf("%d renewals after the deadline's one, want still 1", n)
	}

	mu.Lock()
	stale, failNext = true, true
	mu.Unlock()
	wake <- struct{}{}
	// The first try fails; the next, a second or so later, succeeds.
	want(2, "a renewal of the stale certificate after a failure")
	mu.Lock()
	defer mu.Unlock()
	if failNext {
		t.Errorf("the renewal that was to fail was not tried")
	}
}
