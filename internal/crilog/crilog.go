// Package crilog reads the container logs that containerd's CRI writes for
// the kubelet, and finds them in the kubelet's layout. Each line of a log
// file is one entry,
//
//	2026-01-02T15:04:05.123456789Z stdout F hello
//
// the time (RFC 3339 with nanoseconds), the stream (stdout or stderr), a tag
// (F: the entry ends a line; P: a part of a longer line that the next
// entries continue) and the text. Reader joins the parts back into the lines
// the container printed. The files live at
//
//	<root>/<namespace>_<pod>_<uid>/<container>/<attempt>.log
//
// with root /var/log/pods on a node and the attempt counting the
// container's restarts.
package crilog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

// Entry is one line a container printed.
type Entry struct {
	Time   time.Time // when the line (or its last part) was written
	Stream string    // stdout or stderr
	Line   []byte    // the text, without the newline
}

// ErrFormat is wrapped by the errors for a line that is not a CRI log entry.
var ErrFormat = errors.New("not a CRI log entry")

// Reader reads entries from a log file, which may still be growing.
type Reader struct {
	r       *bufio.Reader
	pending []byte // the start of a line whose newline has not come yet
	partial []byte // the text of P entries waiting for their F entry
}

// NewReader returns a Reader of r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReader(r)} }

// Next returns the next complete line. At the end of what r holds it
// returns io.EOF, keeping any incomplete line; called again, it reads on
// from r, so a file being written can be followed. A malformed line yields
// an error wrapping ErrFormat, and Next can be called again for the next.
func (r *Reader) Next() (Entry, error) {
	for {
		raw, err := r.r.ReadBytes('\n')
		if err != nil {
			r.pending = append(r.pending, raw...)
			return Entry{}, err
		}
		if len(r.pending) > 0 {
			raw = append(r.pending, raw...)
			r.pending = nil
		}
		e, full, err := parse(raw[:len(raw)-1])
		if err != nil {
			return Entry{}, err
		}
		if !full {
			r.partial = append(r.partial, e.Line...)
			continue
		}
		if len(r.partial) > 0 {
			e.Line = append(r.partial, e.Line...)
			r.partial = nil
		}
		return e, nil
	}
}

// Partial is the text of a line begun in P entries that no F entry has
// ended yet: what a container that exited printed last without a newline,
// which containerd logs as P.
func (r *Reader) Partial() []byte { return r.partial }

// Tail returns the last n complete lines of r (every line when n <= 0)
// and the Reader, positioned after them, to follow r with. Malformed lines
// are skipped.
func Tail(r io.Reader, n int) ([]Entry, *Reader, error) {
	rd := NewReader(r)
	var ring []Entry // once full, ring[next] is the oldest
	next := 0
	for {
		e, err := rd.Next()
		switch {
		case errors.Is(err, ErrFormat):
			continue
		case err == io.EOF:
			return slices.Concat(ring[next:], ring[:next]), rd, nil
		case err != nil:
			return nil, nil, err
		}
		if n > 0 && len(ring) == n {
			ring[next] = e
			next = (next + 1) % n
			continue
		}
		ring = append(ring, e)
	}
}

// parse parses one line of a log file, newline removed; full is false for
// a P entry.
func parse(line []byte) (e Entry, full bool, err error) {
	fields := bytes.SplitN(line, []byte(" "), 4)
	if len(fields) < 3 {
		return e, false, fmt.Errorf("%w: %q", ErrFormat, line)
	}
	if e.Time, err = time.Parse(time.RFC3339Nano, string(fields[0])); err != nil {
		return e, false, fmt.Errorf("%w: %q: %v", ErrFormat, line, err)
	}
	e.Stream = string(fields[1])
	if e.Stream != "stdout" && e.Stream != "stderr" {
		return e, false, fmt.Errorf("%w: %q: stream %q", ErrFormat, line, e.Stream)
	}
	switch string(fields[2]) {
	case "F":
		full = true
	case "P":
	default:
		return e, false, fmt.Errorf("%w: %q: tag %q", ErrFormat, line, fields[2])
	}
	if len(fields) == 4 {
		e.Line = fields[3]
	}
	return e, full, nil
}
