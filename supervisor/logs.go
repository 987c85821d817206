package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/cairn-os/cairn/supervisor/safe"
)

// maxLine is the longest line kept whole; a longer one is cut into lines of
// this size.
const maxLine = 64 << 10

// logSink takes a service's output, cuts it into lines and keeps each line
// in a ring buffer, in a size-rotated file and in the optional tee.
type logSink struct {
	mu      sync.Mutex
	partial []byte
	ring    ring
	file    *rotator      // nil: ring only
	tee     io.Writer     // nil: none
	wake    chan struct{} // closed and replaced at each new line
}

func newLogSink(ringBytes int, file *rotator, tee io.Writer) *logSink {
	return &logSink{ring: ring{max: ringBytes}, file: file, tee: tee, wake: make(chan struct{})}
}

// Write takes any amount of output; it never fails, so a service is never
// blocked by its logs.
func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		chunk := p
		if i := bytes.IndexByte(p, '\n'); i >= 0 {
			chunk = p[:i+1]
		}
		p = p[len(chunk):]
		l.partial = append(l.partial, chunk...)
		for len(bytes.TrimSuffix(l.partial, []byte("\n"))) > maxLine {
			l.add(append(l.partial[:maxLine:maxLine], '\n'))
			l.partial = append(l.partial[:0], l.partial[maxLine:]...)
		}
		if bytes.HasSuffix(l.partial, []byte("\n")) {
			l.add(l.partial)
			l.partial = l.partial[:0]
		}
	}
	return n, nil
}

// note adds a line of the supervisor's own, ending any partial line first.
func (l *logSink) note(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.partial) > 0 {
		l.add(append(l.partial, '\n'))
		l.partial = l.partial[:0]
	}
	l.add(fmt.Appendf(nil, "[supervisor] "+format+"\n", args...))
}

// add keeps one whole line, which ends in '\n'. l.mu is held.
func (l *logSink) add(line []byte) {
	line = bytes.Clone(line)
	l.ring.add(line)
	if l.file != nil {
		l.file.write(line)
	}
	if l.tee != nil {
		l.tee.Write(line)
	}
	close(l.wake)
	l.wake = make(chan struct{})
}

// tail returns the last n lines in the ring, all of them when n <= 0.
func (l *logSink) tail(n int) []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := l.ring.lines
	if n > 0 && n < len(lines) {
		lines = lines[len(lines)-n:]
	}
	return bytes.Join(lines, nil)
}

// follow sends the last n lines (none when n <= 0), then each new line, on
// the returned channel until ctx ends. A follower that falls behind by more
// than the ring holds is told how many lines it missed.
func (l *logSink) follow(ctx context.Context, log *slog.Logger, n int) <-chan []byte {
	l.mu.Lock()
	next := l.ring.next() - uint64(min(max(n, 0), len(l.ring.lines)))
	l.mu.Unlock()
	out := make(chan []byte)
	safe.Go(log, "follow logs", func() {
		defer close(out)
		for {
			l.mu.Lock()
			var lines [][]byte
			if next < l.ring.first {
				lines = append(lines, fmt.Appendf(nil, "[supervisor] %d lines dropped\n", l.ring.first-next))
				next = l.ring.first
			}
			lines = append(lines, l.ring.lines[next-l.ring.first:]...)
			next = l.ring.next()
			wake := l.wake
			l.mu.Unlock()
			for _, line := range lines {
				select {
				case out <- line:
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return
			}
		}
	})
	return out
}

// ring holds the last lines of output that fit in max bytes (at least one
// line). Lines are numbered from 0 as they arrive; first is the number of
// lines[0].
type ring struct {
	max   int
	size  int
	first uint64
	lines [][]byte
}

func (r *ring) add(line []byte) {
	r.lines = append(r.lines, line)
	r.size += len(line)
	for r.size > r.max && len(r.lines) > 1 {
		r.size -= len(r.lines[0])
		r.lines[0] = nil
		r.lines = r.lines[1:]
		r.first++
	}
}

func (r *ring) next() uint64 { return r.first + uint64(len(r.lines)) }

// rotator appends lines to a file, renaming it to path.1 (path.1 to path.2,
// and so on, keeping keep old files) before a line would take it past max
// bytes. A line is never split across files.
type rotator struct {
	path string
	max  int64
	keep int
	log  *slog.Logger

	f      *os.File
	size   int64
	failed bool // an error was logged; don't log again until a write works
}

func (r *rotator) write(line []byte) {
	if r.f != nil && r.size > 0 && r.size+int64(len(line)) > r.max {
		r.f.Close()
		r.f = nil
		r.rotate()
	}
	if r.f == nil {
		if err := r.open(); err != nil {
			r.fail(err)
			return
		}
	}
	n, err := r.f.Write(line)
	r.size += int64(n)
	if err != nil {
		r.fail(fmt.Errorf("write %s: %w", r.path, err))
		return
	}
	r.failed = false
}

func (r *rotator) open() error {
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	r.f, r.size = f, st.Size()
	return nil
}

// rotate shifts path.N-1 to path.N, ..., path to path.1, dropping the
// oldest.
func (r *rotator) rotate() {
	for i := r.keep - 1; i >= 0; i-- {
		from := r.path
		if i > 0 {
			from = fmt.Sprintf("%s.%d", r.path, i)
		}
		err := os.Rename(from, fmt.Sprintf("%s.%d", r.path, i+1))
		if err != nil && !os.IsNotExist(err) {
			r.fail(err)
		}
	}
}

func (r *rotator) fail(err error) {
	if !r.failed {
		r.log.Warn("log file", "file", filepath.Base(r.path), "err", err)
	}
	r.failed = true
}
