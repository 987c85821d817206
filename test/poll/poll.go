// Package poll waits in tests for what happens in another process: a
// control plane, a runtime, a VM.
package poll

import (
	"testing"
	"time"
)

// Interval is how often Until calls its function.
const Interval = 100 * time.Millisecond

// Until calls f every Interval until it returns nil, and fails the test
// with what and f's last error if that takes longer than timeout.
func Until(tb testing.TB, timeout time.Duration, what string, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not after %v: %v", what, timeout, err)
		}
		time.Sleep(Interval)
	}
}
