package crilog

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A log as containerd writes it: a long line split in parts, both
// streams, an empty line, and a line that is not an entry.
const sample = `2026-01-02T15:04:05.000000001Z stdout F hello from cairn-test-image pid=1 args=
2026-01-02T15:04:05.000000002Z stderr P a long line, 
2026-01-02T15:04:05.000000003Z stderr P split in
2026-01-02T15:04:05.000000004Z stderr F  three parts
not an entry
2026-01-02T15:04:05.000000005Z stdout F 
2026-01-02T15:04:10.5Z stdout F tick 1
`

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func lines(es []Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Stream+": "+string(e.Line))
	}
	return out
}

func TestTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	writeFile(t, path, sample)
	all := []string{
		"stdout: hello from cairn-test-image pid=1 args=",
		"stderr: a long line, split in three parts",
		"stdout: ",
		"stdout: tick 1",
	}
	for _, tt := range []struct {
		n    int
		want []string
	}{
		{0, all},
		{2, all[2:]},
		{4, all},
		{10, all},
	} {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := Tail(f, tt.n)
		f.Close()
		if err != nil {
			t.Fatalf("Tail(%d): %v", tt.n, err)
		}
		if diff := cmp.Diff(tt.want, lines(got)); diff != "" {
			t.Errorf("Tail(%d) lines (-want +got):\n%s", tt.n, diff)
		}
	}
}

func TestEntryTime(t *testing.T) {
	es, _, err := Tail(strings.NewReader(sample), 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 1, 2, 15, 4, 10, 5e8, time.UTC); len(es) != 1 || !es[0].Time.Equal(want) {
		t.Errorf("last entry = %+v, want time %s", es, want)
	}
}

func TestMalformed(t *testing.T) {
	r := NewReader(strings.NewReader("not an entry\n2026-01-02T15:04:05Z stdin F x\n2026-01-02T15:04:05Z stdout X x\n2026-01-02T15:04:05Z stdout F ok\n"))
	for i := range 3 {
		if _, err := r.Next(); !errors.Is(err, ErrFormat) {
			t.Errorf("Next() #%d = %v, want ErrFormat", i+1, err)
		}
	}
	if e, err := r.Next(); err != nil || string(e.Line) != "ok" {
		t.Errorf("Next() after malformed lines = %q, %v; want ok", e.Line, err)
	}
}

// TestFollow reads a file while it is written, in pieces that end
// mid-line and mid-parts.
func TestFollow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	writeFile(t, path, "2026-01-02T15:04:05Z stdout F first\n2026-01-02T15:04:06Z stdout P sec")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, r, err := Tail(f, 0)
	if err != nil || len(got) != 1 {
		t.Fatalf("Tail = %v, %v; want the first line only", lines(got), err)
	}
	w, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, piece := range []string{"ond \n", "2026-01-02T15:04:07Z stdout F li", "ne\n"} {
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("Next() before %q = %v, want io.EOF", piece, err)
		}
		if _, err := w.WriteString(piece); err != nil {
			t.Fatal(err)
		}
	}
	if e, err := r.Next(); err != nil || string(e.Line) != "second line" {
		t.Errorf("Next() = %q, %v; want %q", e.Line, err, "second line")
	}
}

func TestFind(t *testing.T) {
	root := t.TempDir()
	old := PodDir(root, "default", "web", "uid-old")
	writeFile(t, filepath.Join(old, ContainerLog("app", 0)), sample)
	// The same pod created again, later; its container restarted ten times.
	cur := PodDir(root, "default", "web", "uid-new")
	for _, a := range []uint32{0, 2, 10} {
		writeFile(t, filepath.Join(cur, ContainerLog("app", a)), sample)
	}
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(PodDir(root, "default", "web-2", "uid-2"), ContainerLog("app", 0)), sample)
	two := PodDir(root, "kube-system", "two", "uid-3")
	writeFile(t, filepath.Join(two, ContainerLog("a", 0)), sample)
	writeFile(t, filepath.Join(two, ContainerLog("b", 0)), sample)

	for _, tt := range []struct {
		ns, pod, container string
		previous           bool
		want, wantErr      string
	}{
		{ns: "default", pod: "web", container: "app", previous: true, want: filepath.Join(cur, "app", "2.log")},
		{ns: "default", pod: "web-2", container: "app", previous: true, wantErr: "previous container app of pod default/web-2: no logs"},
		{ns: "default", pod: "web", container: "app", want: filepath.Join(cur, "app", "10.log")},
		{ns: "default", pod: "web", want: filepath.Join(cur, "app", "10.log")},
		{ns: "default", pod: "web-2", want: filepath.Join(root, "default_web-2_uid-2", "app", "0.log")},
		{ns: "kube-system", pod: "two", container: "b", want: filepath.Join(two, "b", "0.log")},
		{ns: "kube-system", pod: "two", wantErr: "containers [a b]: name one"},
		{ns: "default", pod: "web", container: "db", wantErr: "container db of pod default/web: no logs"},
		{ns: "default", pod: "we", wantErr: "pod default/we: no logs"},
		{ns: "..", pod: "web", wantErr: `pod ".."/"web"`},
		{ns: "default", pod: "*", wantErr: `pod "default"/"*"`},
	} {
		got, err := Find(root, tt.ns, tt.pod, tt.container, tt.previous)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Find(%s, %s, %q, %v) = %q, %v; want an error with %q", tt.ns, tt.pod, tt.container, tt.previous, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Find(%s, %s, %q, %v) = %q, %v; want %q", tt.ns, tt.pod, tt.container, tt.previous, got, err, tt.want)
		}
	}
}

// TestPartial reads the log of a container whose last output had no
// newline: containerd writes it as a P entry that no F entry ends.
func TestPartial(t *testing.T) {
	log := sample + "2026-01-02T15:04:11Z stdout P DO\n2026-01-02T15:04:11Z stdout P NE\n"
	got, r, err := Tail(strings.NewReader(log), 1)
	if err != nil {
		t.Fatalf("Tail: %v", err)
	}
	if diff := cmp.Diff([]string{"stdout: tick 1"}, lines(got)); diff != "" {
		t.Errorf("Tail lines (-want +got):\n%s", diff)
	}
	if p := string(r.Partial()); p != "DONE" {
		t.Errorf("Partial() = %q, want %q", p, "DONE")
	}
	if _, r, _ := Tail(strings.NewReader(sample), 0); r.Partial() != nil {
		t.Errorf("Partial() of a log whose lines all ended = %q, want none", r.Partial())
	}
}
