package crilog

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestStream(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	writeFile(t, path, sample)
	all := []string{"stdout: hello from cairn-test-image pid=1 args=", "stderr: a long line, split in three parts", "stdout: ", "stdout: tick 1"}
	for _, tt := range []struct {
		name string
		o    StreamOptions
		want []string
	}{
		{"every line", StreamOptions{Tail: -1}, all},
		{"no line", StreamOptions{Tail: 0}, nil},
		{"the last two", StreamOptions{Tail: 2}, all[2:]},
		{"since the tick", StreamOptions{Tail: -1, Since: time.Date(2026, 1, 2, 15, 4, 10, 0, time.UTC)}, all[3:]},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			err := Stream(t.Context(), path, tt.o, func(es []Entry) error {
				got = append(got, lines(es)...)
				return nil
			})
			if err != nil {
				t.Fatalf("Stream() = %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Stream() lines mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStreamFollow follows a log being written until Stop says the
// container exited, and another until its context ends.
func TestStreamFollow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	writeFile(t, path, sample)
	got := make(chan []string, 10)
	exited := make(chan struct{})
	o := StreamOptions{Tail: 1, Follow: true, Poll: 10 * time.Millisecond, Stop: func() bool {
		select {
		case <-exited:
			return true
		default:
			return false
		}
	}}
	done := make(chan error, 1)
	go func() {
		done <- Stream(t.Context(), path, o, func(es []Entry) error {
			got <- lines(es)
			return nil
		})
	}()
	if first := <-got; !slices.Equal(first, []string{"stdout: tick 1"}) {
		t.Fatalf("Stream() first batch = %q, want the last line", first)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("2026-01-02T15:04:11Z stdout F tick 2\n"); err != nil {
		t.Fatal(err)
	}
	if next := <-got; !slices.Equal(next, []string{"stdout: tick 2"}) {
		t.Fatalf("Stream() followed batch = %q, want tick 2", next)
	}
	close(exited)
	if err := <-done; err != nil {
		t.Errorf("Stream() after the container exited = %v, want nil", err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	o.Stop = nil
	go func() { done <- Stream(ctx, path, o, func([]Entry) error { return nil }) }()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Stream() after its context ended = %v, want nil", err)
	}
}
