package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestLogSinkCutsLines(t *testing.T) {
	long := strings.Repeat("x", maxLine+10)
	tests := []struct {
		name   string
		writes []string
		note   string
		want   []string
	}{
		{"whole lines", []string{"a\nb\n"}, "", []string{"a\n", "b\n"}},
		{"lines across writes", []string{"a", "b\nc", "d\n\n"}, "", []string{"ab\n", "cd\n", "\n"}},
		{"partial line kept", []string{"a\nb"}, "", []string{"a\n"}},
		{"note ends a partial line", []string{"a\nb"}, "hello", []string{"a\n", "b\n", "[supervisor] hello\n"}},
		{"long line cut", []string{long[:100], long[100:] + "\n"}, "", []string{long[:maxLine] + "\n", long[maxLine:] + "\n"}},
	}
	for _, tt := range tests {
		l := newLogSink(1<<20, nil, nil)
		for _, w := range tt.writes {
			if n, err := l.Write([]byte(w)); n != len(w) || err != nil {
				t.Errorf("%s: Write(%d bytes) = %d, %v, want %d, nil", tt.name, len(w), n, err, len(w))
			}
		}
		if tt.note != "" {
			l.note("%s", tt.note)
		}
		var got []string
		for _, line := range l.ring.lines {
			got = append(got, string(line))
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s: lines (-want +got):\n%s", tt.name, diff)
		}
	}
}

// TestLogRotation has a service print many lines into a small log file:
// the rotated files and the current one hold every line, none split, and
// the ring holds the tail.
func TestLogRotation(t *testing.T) {
	dir := t.TempDir()
	const maxBytes, ringBytes = 1000, 2000
	s := New(Options{Log: quietLog(), LogDir: dir, LogMaxBytes: maxBytes, LogKeep: 1000, RingBytes: ringBytes})
	err := s.Add(Service{Name: "chatty", Path: "/bin/sh", Args: []string{"-c", "seq 1 5000; exec sleep 60"}, LogFile: "chatty.log"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	var printed bytes.Buffer
	for i := 1; i <= 5000; i++ {
		fmt.Fprintf(&printed, "%d\n", i)
	}
	waitFor(t, "the last line", func() bool {
		logs, _ := s.Logs("chatty", 1)
		return string(logs) == "5000\n"
	})

	files, _ := filepath.Glob(filepath.Join(dir, "chatty.log.*"))
	var all []byte
	for i := len(files); i >= 1; i-- { // oldest first
		all = append(all, readLogFile(t, fmt.Sprintf("%s/chatty.log.%d", dir, i), maxBytes)...)
	}
	all = append(all, readLogFile(t, dir+"/chatty.log", maxBytes)...)
	if !bytes.Equal(all, printed.Bytes()) {
		t.Errorf("rotated files + current hold %d bytes, want the %d printed; first difference at %d",
			len(all), printed.Len(), firstDiff(all, printed.Bytes()))
	}
	if len(files) < printed.Len()/maxBytes {
		t.Errorf("%d rotated files, want at least %d", len(files), printed.Len()/maxBytes)
	}

	ring, _ := s.Logs("chatty", 0)
	if len(ring) > ringBytes || len(ring) < ringBytes-5 || !bytes.HasSuffix(printed.Bytes(), ring) {
		t.Errorf("Logs(chatty, 0) = %d bytes, want the last %d or so printed", len(ring), ringBytes)
	}
	if tail, _ := s.Logs("chatty", 3); string(tail) != "4998\n4999\n5000\n" {
		t.Errorf("Logs(chatty, 3) = %q, want %q", tail, "4998\n4999\n5000\n")
	}
	if _, err := s.Logs("nope", 3); err == nil {
		t.Error("Logs(nope, 3) = nil error, want one")
	}
}

// readLogFile reads a log file, checking it is within limit bytes and ends
// with a whole line.
func readLogFile(t *testing.T, path string, limit int) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > limit || (len(raw) > 0 && raw[len(raw)-1] != '\n') {
		t.Errorf("%s: %d bytes ending in %q, want at most %d ending in a newline", filepath.Base(path), len(raw), raw[max(0, len(raw)-5):], limit)
	}
	return raw
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestRotatorKeepsNewestFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	r := &rotator{path: path, max: 10, keep: 2, log: quietLog()}
	for i := range 10 {
		r.write(fmt.Appendf(nil, "line %d\n", i)) // 7 bytes: one line a file
	}
	got := map[string]string{}
	files, _ := filepath.Glob(path + "*")
	for _, f := range files {
		raw, _ := os.ReadFile(f)
		got[filepath.Base(f)] = string(raw)
	}
	want := map[string]string{"x.log": "line 9\n", "x.log.1": "line 8\n", "x.log.2": "line 7\n"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log files (-want +got):\n%s", diff)
	}
}

func TestFollow(t *testing.T) {
	dir := t.TempDir()
	goOn := filepath.Join(dir, "go")
	s := New(Options{Log: quietLog()})
	err := s.Add(Service{
		Name: "svc", Path: "/bin/sh",
		Args: []string{"-c", `echo a; echo b; while [ ! -e "$1" ]; do sleep 0.01; done; echo c; echo d; exec sleep 60`, "sh", goOn},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	waitFor(t, "b", func() bool { logs, _ := s.Logs("svc", 0); return string(logs) == "a\nb\n" })

	ctx, cancel := context.WithCancel(context.Background())
	lines, err := s.Follow(ctx, "svc", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(goOn, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 3 {
		select {
		case line := <-lines:
			got = append(got, string(line))
		case <-time.After(5 * time.Second):
			t.Fatalf("Follow(svc, 1) sent %q, then nothing for 5 s", got)
		}
	}
	if diff := cmp.Diff([]string{"b\n", "c\n", "d\n"}, got); diff != "" {
		t.Errorf("Follow(svc, 1) (-want +got):\n%s", diff)
	}
	cancel()
	for range lines {
	}
	if _, err := s.Follow(context.Background(), "nope", 0); err == nil {
		t.Error("Follow(nope) = nil error, want one")
	}
}

// TestFollowFallsBehind: a follower that lags by more than the ring holds
// is told how many lines it missed.
func TestFollowFallsBehind(t *testing.T) {
	l := newLogSink(10, nil, nil)
	l.Write([]byte("a\n"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines := l.follow(ctx, slog.Default(), 1)
	first := <-lines // "a\n", taken before the rest is written
	l.Write([]byte("b\nc\nd\ne\nf\ng\n"))
	got := []string{string(first)}
	for len(got) < 7 {
		got = append(got, string(<-lines))
	}
	want := []string{"a\n", "[supervisor] 1 lines dropped\n", "c\n", "d\n", "e\n", "f\n", "g\n"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("follow (-want +got):\n%s", diff)
	}
}
