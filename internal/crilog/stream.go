package crilog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// StreamOptions select the lines Stream sends.
type StreamOptions struct {
	// Tail sends only the last Tail lines present at the start; every
	// line when negative.
	Tail int
	// Since, if set, drops the lines written before it.
	Since time.Time
	// Follow goes on sending the lines written after the start, until ctx
	// ends, the log is removed or Stop says so.
	Follow bool
	// Poll is how often a followed log is read again once its end is
	// reached.
	Poll time.Duration
	// Stop, if set, is asked at each end of a followed log: true ends
	// the stream there, as when the container exited.
	Stop func() bool
}

// Stream calls send with the lines of the log at path that o selects:
// first those present, then, when following, each batch read before the
// log's end. A log that the runtime rotates is followed into its new
// file. It returns send's first error, or nil when the stream ends.
func Stream(ctx context.Context, path string, o StreamOptions, send func([]Entry) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open the log: %w", err)
	}
	defer func() { f.Close() }()
	// Tail(f, 0) reads every line; with Tail 0 the reader still has to
	// reach the end, and the one line kept is dropped.
	n := max(o.Tail, 0)
	if o.Tail == 0 {
		n = 1
	}
	tail, r, err := Tail(f, n)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if o.Tail == 0 {
		tail = nil
	}
	if err := send(o.since(tail)); err != nil || !o.Follow {
		return err
	}
	poll := time.NewTicker(o.Poll)
	defer poll.Stop()
	var batch []Entry
	for {
		e, err := r.Next()
		switch {
		case err == nil:
			batch = append(batch, e)
			continue
		case errors.Is(err, ErrFormat):
			continue
		case err != io.EOF:
			return fmt.Errorf("read %s: %w", path, err)
		}
		if len(batch) > 0 {
			if err := send(o.since(batch)); err != nil {
				return err
			}
			batch = nil
		}
		cur, err := os.Stat(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil // removed with its pod
		}
		if old, oerr := f.Stat(); err == nil && oerr == nil && !os.SameFile(old, cur) {
			// Rotated: the old file was read to its end, the runtime
			// writes on in a new one.
			nf, err := os.Open(path)
			if err != nil {
				return fmt.Errorf("open the rotated log: %w", err)
			}
			f.Close()
			f, r = nf, NewReader(nf)
			continue
		}
		if o.Stop != nil && o.Stop() {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-poll.C:
		}
	}
}

// since returns the entries of es written at or after o.Since.
func (o *StreamOptions) since(es []Entry) []Entry {
	if o.Since.IsZero() {
		return es
	}
	kept := es[:0]
	for _, e := range es {
		if !e.Time.Before(o.Since) {
			kept = append(kept, e)
		}
	}
	return kept
}
