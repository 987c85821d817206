package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// consoleHandler writes one short human line per record to the console:
// "cairn: message key=value ...". The serial log is read by people and tests.
type consoleHandler struct {
	mu    *sync.Mutex
	w     io.Writer
	attrs []slog.Attr
}

func newConsoleHandler(w io.Writer) *consoleHandler {
	return &consoleHandler{mu: &sync.Mutex{}, w: w}
}

func (h *consoleHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *consoleHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString("cairn: ")
	if r.Level >= slog.LevelWarn {
		b.WriteString(r.Level.String() + " ")
	}
	b.WriteString(r.Message)
	write := func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	}
	for _, a := range h.attrs {
		write(a)
	}
	r.Attrs(write)
	b.WriteString("\n")
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *consoleHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &consoleHandler{mu: h.mu, w: h.w, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h *consoleHandler) WithGroup(string) slog.Handler { return h }
