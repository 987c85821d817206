package safe

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

func TestCatch(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	want := errors.New("plain failure")
	if err := Catch(log, "plain", func() error { return want }); err != want {
		t.Errorf("Catch(returns an error) = %v, want %v", err, want)
	}
	var m map[string]int
	err := Catch(log, "buggy step", func() error { m["x"] = 1; return nil })
	var pe *PanicError
	if !errors.As(err, &pe) || pe.In != "buggy step" || !strings.HasPrefix(err.Error(), "panic: assignment to entry in nil map") {
		t.Errorf("Catch(panics) = %#v, want a *PanicError in %q", err, "buggy step")
	}
	if !strings.Contains(buf.String(), "panic recovered") || !strings.Contains(buf.String(), "in=\"buggy step\"") {
		t.Errorf("log %q, want the panic recovered, named for what panicked", buf.String())
	}
}

func TestGo(t *testing.T) {
	var buf bytes.Buffer
	done := make(chan struct{})
	Go(slog.New(slog.NewTextHandler(&buf, nil)), "test", func() {
		defer close(done)
		panic("in a goroutine")
	})
	<-done // the test binary is still alive: the panic was recovered
}
