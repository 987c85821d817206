package pods

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// runs makes back-to-back runs of the given lengths starting at t0.
func runs(t0 time.Time, lengths ...time.Duration) []Run {
	var out []Run
	t := t0
	for _, l := range lengths {
		out = append(out, Run{StartedAt: t, FinishedAt: t.Add(l)})
		t = t.Add(l + time.Second)
	}
	return out
}

func TestRestartDelay(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := time.Second
	for _, tc := range []struct {
		name string
		runs []Run
		want time.Duration
	}{
		{"first exit waits 10s", runs(t0, s), 10 * s},
		{"second exit waits 20s", runs(t0, s, s), 20 * s},
		{"third exit waits 40s", runs(t0, s, s, s), 40 * s},
		{"sixth exit waits 5m capped from 320s", runs(t0, s, s, s, s, s, s), 5 * time.Minute},
		{"twentieth exit stays at 5m", runs(t0, make([]time.Duration, 20)...), 5 * time.Minute},
		{"a 10m run resets", runs(t0, s, s, s, s, 10*time.Minute), 10 * s},
		{"short runs after a 10m run count from 10s", runs(t0, s, s, s, 10*time.Minute, s), 20 * s},
		{"just under 10m does not reset", runs(t0, s, s, 10*time.Minute-s), 40 * s},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RestartDelay(tc.runs); got != tc.want {
				t.Errorf("RestartDelay(%d runs) = %v, want %v", len(tc.runs), got, tc.want)
			}
		})
	}
}

func TestNextStart(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := NextStart(nil); !got.IsZero() {
		t.Errorf("NextStart(nil) = %v, want the zero time", got)
	}
	r := runs(t0, time.Second, 2*time.Second)
	if got, want := NextStart(r), r[1].FinishedAt.Add(20*time.Second); !got.Equal(want) {
		t.Errorf("NextStart = %v, want %v (end of the last run + 20s)", got, want)
	}
}

func TestRestarts(t *testing.T) {
	for _, tc := range []struct {
		policy corev1.RestartPolicy
		code   int32
		want   bool
	}{
		{corev1.RestartPolicyAlways, 0, true},
		{corev1.RestartPolicyAlways, 1, true},
		{"", 0, true},
		{corev1.RestartPolicyOnFailure, 0, false},
		{corev1.RestartPolicyOnFailure, 137, true},
		{corev1.RestartPolicyNever, 0, false},
		{corev1.RestartPolicyNever, 1, false},
	} {
		if got := Restarts(tc.policy, tc.code); got != tc.want {
			t.Errorf("Restarts(%q, %d) = %v, want %v", tc.policy, tc.code, got, tc.want)
		}
	}
}

func TestRetryAt(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	st := &Status{
		InitContainers: []ContainerStatus{{Name: "init"}},
		Containers: []ContainerStatus{
			{Name: "a", BackoffUntil: t0.Add(20 * time.Second)},
			{Name: "b"},
			{Name: "c", BackoffUntil: t0.Add(10 * time.Second)},
		},
	}
	if got := st.RetryAt(); !got.Equal(t0.Add(10 * time.Second)) {
		t.Errorf("RetryAt() = %v, want the earliest backoff's end %v", got, t0.Add(10*time.Second))
	}
	if got := (&Status{Containers: []ContainerStatus{{Name: "a"}}}).RetryAt(); !got.IsZero() {
		t.Errorf("RetryAt() with no backoff = %v, want zero", got)
	}
}
