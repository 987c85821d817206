package stage2

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/need"
)

// TestWriteFiles writes machine files under a temporary root: with their
// directories, mode and owner; only those that differ on the next call;
// each as a new file renamed over the old one, which a reader that has it
// open keeps; and none through a symlink out of /etc.
func TestWriteFiles(t *testing.T) {
	need.Root(t, "chown")
	root := t.TempDir()
	for _, d := range []string{"etc", "var"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := []machineconfig.File{
		{Path: "/etc/app/conf.d/app.conf", Content: "level=info\n", Mode: 0o644, Owner: "0:0"},
		{Path: "/var/lib/app/token", Content: "s3cret", Mode: 0o600, Owner: "1000:1001"},
		{Path: "/etc/motd", Content: "", Mode: 0o644, Owner: "0:0"},
	}
	written, err := writeFiles(root, files)
	if err != nil {
		t.Fatalf("writeFiles() = %v", err)
	}
	if diff := cmp.Diff([]string{files[0].Path, files[1].Path, files[2].Path}, written); diff != "" {
		t.Errorf("writeFiles() wrote (-want +got):\n%s", diff)
	}
	check := func(f machineconfig.File) {
		t.Helper()
		p := filepath.Join(root, f.Path)
		data, err := os.ReadFile(p)
		if err != nil || string(data) != f.Content {
			t.Errorf("%s = %q, %v; want %q", f.Path, data, err, f.Content)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		uid, gid := f.Ownership()
		if fi.Mode() != os.FileMode(f.Mode) || int(st.Uid) != uid || int(st.Gid) != gid {
			t.Errorf("%s: mode %v, owner %d:%d; want %v, %s", f.Path, fi.Mode(), st.Uid, st.Gid, os.FileMode(f.Mode), f.Owner)
		}
	}
	for _, f := range files {
		check(f)
	}
	if fi, err := os.Stat(filepath.Join(root, "etc/app/conf.d")); err != nil || fi.Mode() != os.ModeDir|0o755 {
		t.Errorf("etc/app/conf.d: %v, %v; want a 0755 directory", fi, err)
	}

	if written, err := writeFiles(root, files); err != nil || len(written) != 0 {
		t.Errorf("writeFiles() again = %v, %v; want nothing written", written, err)
	}

	// A reader of the old file keeps it: the new one is another file.
	old, err := os.Open(filepath.Join(root, files[0].Path))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	files[0].Content = "level=debug\n"
	files[1].Mode = 0o640
	if written, err := writeFiles(root, files); err != nil || len(written) != 2 {
		t.Errorf("writeFiles() with a new content and a new mode = %v, %v; want both written", written, err)
	}
	for _, f := range files {
		check(f)
	}
	buf := make([]byte, 64)
	if n, _ := old.ReadAt(buf, 0); string(buf[:n]) != "level=info\n" {
		t.Errorf("the file open before the write reads %q, want the old content: it was not replaced by a rename", buf[:n])
	}

	// A symlink out of /etc is not followed.
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "etc/out")); err != nil {
		t.Fatal(err)
	}
	_, err = writeFiles(root, []machineconfig.File{{Path: "/etc/out/x", Content: "x", Mode: 0o644, Owner: "0:0"}, files[0]})
	if err == nil || !strings.Contains(err.Error(), "write /etc/out/x (machine.files[0]): ") {
		t.Errorf("writeFiles(through a symlink out of /etc) = %v, want it refused, naming the file", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("writeFiles wrote %v outside /etc", entries)
	}
	entries, err := os.ReadDir(filepath.Join(root, "etc/app/conf.d"))
	if err != nil || len(entries) != 1 {
		t.Errorf("etc/app/conf.d holds %v (%v), want app.conf alone: no temporary file left", entries, err)
	}
}
