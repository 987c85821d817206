package boot

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// ConsoleHandler writes one short human line per record to the console:
// "cairn: message key=value ...". The serial log is read by people and tests.
type ConsoleHandler struct {
	mu    *sync.Mutex
	w     io.Writer
	attrs []slog.Attr
}

// NewConsoleHandler returns a handler writing to w, normally /dev/console.
func NewConsoleHandler(w io.Writer) *ConsoleHandler {
	return &ConsoleHandler{mu: &sync.Mutex{}, w: w}
}

func (h *ConsoleHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *ConsoleHandler) Handle(_ context.Context, r slog.Record) error {
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

func (h *ConsoleHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &ConsoleHandler{mu: h.mu, w: h.w, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h *ConsoleHandler) WithGroup(string) slog.Handler { return h }
