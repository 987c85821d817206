package volumes

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// entries lists dir's top-level names, each link with its target.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, de := range des {
		name := de.Name()
		if strings.HasPrefix(name, "..2") {
			name = "..TIMESTAMP"
		}
		if target, err := os.Readlink(filepath.Join(dir, de.Name())); err == nil {
			if strings.HasPrefix(target, "..2") {
				target = "..TIMESTAMP"
			}
			name += " -> " + target
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func mustWrite(t *testing.T, dir string, files map[string]file) bool {
	t.Helper()
	wrote, err := writeAtomic(dir, files)
	if err != nil {
		t.Fatalf("writeAtomic(%s) = %v", dir, err)
	}
	return wrote
}

func TestWriteAtomicLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	v1 := map[string]file{
		"token":     {data: []byte("t1"), mode: 0o644},
		"ca.crt":    {data: []byte("ca"), mode: 0o600},
		"sub/inner": {data: []byte("in"), mode: 0o755},
	}
	if !mustWrite(t, dir, v1) {
		t.Fatal("first write: wrote = false, want true")
	}
	want := []string{"..TIMESTAMP", "..data -> ..TIMESTAMP", "ca.crt -> ..data/ca.crt", "sub -> ..data/sub", "token -> ..data/token"}
	if diff := cmp.Diff(want, entries(t, dir)); diff != "" {
		t.Errorf("layout after the first write (-want +got):\n%s", diff)
	}
	for p, f := range v1 {
		full := filepath.Join(dir, p) // through the links, as a reader goes
		data, err := os.ReadFile(full)
		if err != nil || !bytes.Equal(data, f.data) {
			t.Errorf("ReadFile(%s) = %q, %v; want %q", p, data, err, f.data)
		}
		if info, err := os.Stat(full); err != nil || info.Mode().Perm() != f.mode {
			t.Errorf("mode of %s = %v (%v), want %v", p, info.Mode().Perm(), err, f.mode)
		}
	}
	first, _ := os.Readlink(filepath.Join(dir, dataLink))

	if mustWrite(t, dir, v1) {
		t.Error("same content again: wrote = true, want false")
	}
	if again, _ := os.Readlink(filepath.Join(dir, dataLink)); again != first {
		t.Errorf("same content again moved ..data from %s to %s", first, again)
	}
	modeOnly := map[string]file{"token": v1["token"], "ca.crt": {data: []byte("ca"), mode: 0o644}, "sub/inner": v1["sub/inner"]}
	if !mustWrite(t, dir, modeOnly) {
		t.Error("a changed mode: wrote = false, want true")
	}

	v2 := map[string]file{"token": {data: []byte("t2"), mode: 0o644}, "namespace": {data: []byte("ns"), mode: 0o644}}
	if !mustWrite(t, dir, v2) {
		t.Fatal("new content: wrote = false, want true")
	}
	// The version before stays, for readers that were just opening it.
	want = []string{"..TIMESTAMP", "..TIMESTAMP", "..data -> ..TIMESTAMP", "namespace -> ..data/namespace", "token -> ..data/token"}
	if diff := cmp.Diff(want, entries(t, dir)); diff != "" {
		t.Errorf("layout after new content (-want +got):\n%s", diff)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "token")); string(data) != "t2" {
		t.Errorf("token = %q after the rewrite, want t2", data)
	}
}

func TestWriteAtomicBadPaths(t *testing.T) {
	for _, p := range []string{"../escape", "/abs", "..data", "..2020_x/f", "a/../b", "a//b", ""} {
		if _, err := writeAtomic(filepath.Join(t.TempDir(), "vol"), map[string]file{p: {mode: 0o644}}); err == nil {
			t.Errorf("writeAtomic with path %q = nil error, want one", p)
		}
	}
	files := map[string]file{"a": {mode: 0o644}, "a/b": {mode: 0o644}}
	if _, err := writeAtomic(filepath.Join(t.TempDir(), "vol"), files); err == nil {
		t.Error("writeAtomic with a and a/b = nil error, want one")
	}
}

// TestWriteAtomicReaders has readers open the file through its link while
// it is rewritten back to back: each read sees one whole version. A
// reader stalled between resolving ..data and opening the file while two
// rewrites pass may find that version gone (ENOENT); such reads are
// counted, not failed, as real rewrites are minutes apart
// (TestWriteAtomicKeepsPrevious checks the one version kept).
func TestWriteAtomicReaders(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	const size = 256 << 10
	versions := [][]byte{bytes.Repeat([]byte("a"), size), bytes.Repeat([]byte("b"), size)}
	mustWrite(t, dir, map[string]file{"token": {data: versions[0], mode: 0o644}})

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad []string
	var mu sync.Mutex
	reads, gone := 0, 0
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				data, err := os.ReadFile(filepath.Join(dir, "token"))
				mu.Lock()
				reads++
				switch {
				case errors.Is(err, fs.ErrNotExist):
					gone++
				case err != nil || !(bytes.Equal(data, versions[0]) || bytes.Equal(data, versions[1])):
					bad = append(bad, describe(data, err))
				}
				mu.Unlock()
			}
		})
	}
	for i := range 200 {
		mustWrite(t, dir, map[string]file{"token": {data: versions[(i+1)%2], mode: 0o644}})
	}
	close(stop)
	wg.Wait()
	if len(bad) > 0 {
		t.Errorf("%d of %d reads saw no whole version, such as %s", len(bad), reads, bad[0])
	}
	t.Logf("%d reads during 200 back-to-back rewrites: %d whole, %d found their version gone", reads, reads-len(bad)-gone, gone)
	if n := len(entries(t, dir)); n != 4 {
		t.Errorf("%d entries after the rewrites (%v), want 4: two timestamped directories, ..data and token", n, entries(t, dir))
	}
}

// TestWriteAtomicKeepsPrevious: a reader that resolved ..data just before
// a rewrite still opens its files; the version before that is removed.
func TestWriteAtomicKeepsPrevious(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	version := func(s string) map[string]file { return map[string]file{"token": {data: []byte(s), mode: 0o644}} }
	mustWrite(t, dir, version("1"))
	first, err := os.Readlink(filepath.Join(dir, dataLink))
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, dir, version("2"))
	if data, err := os.ReadFile(filepath.Join(dir, first, "token")); err != nil || string(data) != "1" {
		t.Errorf("the version before, after one rewrite: %q, %v; want 1", data, err)
	}
	mustWrite(t, dir, version("3"))
	if _, err := os.Stat(filepath.Join(dir, first)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the version two rewrites back: %v, want it removed", err)
	}
}

func describe(data []byte, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d bytes starting %q", len(data), data[:min(len(data), 8)])
}
