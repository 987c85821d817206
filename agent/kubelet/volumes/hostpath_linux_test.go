package volumes

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestHostPath checks each type against real files of each kind: a
// directory, a file, a Unix socket, /dev/null and a block device node
// made for the test; the OrCreate types make what is missing.
func TestHostPath(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	block := filepath.Join(dir, "block")
	// loop0's numbers; a node in a temporary directory opens nothing.
	if err := syscall.Mknod(block, syscall.S_IFBLK|0o600, 7<<8); err != nil {
		t.Fatalf("mknod %s (the test runs as root): %v", block, err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(sock, link); err != nil {
		t.Fatal(err)
	}
	const char = "/dev/null"

	for _, tc := range []struct {
		typ  corev1.HostPathType
		path string
		want string // the error, empty if none
	}{
		{corev1.HostPathUnset, filepath.Join(dir, "missing"), ""},
		{corev1.HostPathDirectory, dir, ""},
		{corev1.HostPathDirectory, file, "hostPath type check failed: " + file + " is not a directory, it's a File"},
		{corev1.HostPathDirectory, filepath.Join(dir, "missing"), "hostPath type check failed, " + filepath.Join(dir, "missing") +
			` is not a directory, unable to determine its type: path "` + filepath.Join(dir, "missing") + `" does not exist`},
		{corev1.HostPathDirectoryOrCreate, file, "hostPath type check failed: " + file + " is not a directory, it's a File"},
		{corev1.HostPathFile, file, ""},
		{corev1.HostPathFile, dir, "hostPath type check failed: " + dir + " is not a file, it's a Directory"},
		{corev1.HostPathFileOrCreate, dir, "hostPath type check failed: " + dir + " is not a file, it's a Directory"},
		{corev1.HostPathFileOrCreate, filepath.Join(dir, "nodir", "f"), "open " + filepath.Join(dir, "nodir", "f") + ": no such file or directory"},
		{corev1.HostPathSocket, sock, ""},
		{corev1.HostPathSocket, link, ""},
		{corev1.HostPathSocket, file, "hostPath type check failed: " + file + " is not a socket file, it's a File"},
		{corev1.HostPathCharDev, char, ""},
		{corev1.HostPathCharDev, block, "hostPath type check failed: " + block + " is not a character device, it's a BlockDevice"},
		{corev1.HostPathBlockDev, block, ""},
		{corev1.HostPathBlockDev, char, "hostPath type check failed: " + char + " is not a block device, it's a CharDevice"},
		{corev1.HostPathBlockDev, fifo, "hostPath type check failed, " + fifo +
			" is not a block device, unable to determine its type: only recognise file, directory, socket, block device and character device"},
		{corev1.HostPathDirectory, dir + "/../etc", "invalid HostPath `" + dir + "/../etc`: must not contain '..'"},
		{"Pipe", fifo, "Pipe is an invalid volume type"},
	} {
		typ := tc.typ
		got, err := hostPath(&corev1.HostPathVolumeSource{Path: tc.path, Type: &typ})
		switch {
		case tc.want == "" && (err != nil || got != tc.path):
			t.Errorf("hostPath(%s %q) = %q, %v; want the path itself", tc.typ, tc.path, got, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want):
			t.Errorf("hostPath(%s %q) = %q, %v; want the error %q", tc.typ, tc.path, got, err, tc.want)
		}
	}

	// The OrCreate types make what is missing: a directory 0755 with its
	// parents, a file 0644 (less the umask, 022 here), and leave it on a
	// second call.
	defer syscall.Umask(syscall.Umask(0o022))
	made := filepath.Join(dir, "a", "b")
	newFile := filepath.Join(dir, "new")
	for range 2 {
		for _, tc := range []struct {
			typ  corev1.HostPathType
			path string
			mode os.FileMode
		}{
			{corev1.HostPathDirectoryOrCreate, made, os.ModeDir | 0o755},
			{corev1.HostPathFileOrCreate, newFile, 0o644},
		} {
			typ := tc.typ
			if got, err := hostPath(&corev1.HostPathVolumeSource{Path: tc.path, Type: &typ}); err != nil || got != tc.path {
				t.Errorf("hostPath(%s %q) = %q, %v; want it made", tc.typ, tc.path, got, err)
			}
			if info, err := os.Stat(tc.path); err != nil || info.Mode() != tc.mode {
				t.Errorf("%s made %v (%v), want mode %v", tc.typ, info, err, tc.mode)
			}
		}
	}
	if err := os.WriteFile(newFile, []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	typ := corev1.HostPathFileOrCreate
	if _, err := hostPath(&corev1.HostPathVolumeSource{Path: newFile, Type: &typ}); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(newFile); string(data) != "kept" {
		t.Errorf("FileOrCreate of an existing file left %q, want it untouched", data)
	}
}

// TestSetupHostPath: Setup returns a hostPath volume's path itself,
// checked once, and TearDown leaves it where it is.
func TestSetupHostPath(t *testing.T) {
	host := filepath.Join(t.TempDir(), "data")
	clk := &clock{}
	m := &Manager{Root: t.TempDir(), Now: clk.now}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: "hostpath-1"},
		Spec: corev1.PodSpec{Volumes: []corev1.Volume{
			{Name: "data", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: host, Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}},
			{Name: "img", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "example.com/data:v1"}}},
		}},
	}
	paths, err := m.Setup(context.Background(), pod)
	if err != nil || paths["data"] != host {
		t.Fatalf("Setup = %v, %v; want data at %s", paths, err, host)
	}
	if p, ok := paths["img"]; ok {
		t.Errorf("Setup gave the image volume the host path %q, want none", p)
	}
	if err := os.WriteFile(filepath.Join(host, "kept"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A container may replace what it mounts: not checked again.
	clk.advance(DefaultResync)
	if err := os.Rename(host, host+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(host, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.Refresh(context.Background(), pod); err != nil {
		t.Errorf("Refresh after the directory became a file = %v, want no check again", err)
	}
	if err := m.TearDown(pod.UID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(host+".old", "kept")); err != nil {
		t.Errorf("after TearDown: %v, want the host's files left", err)
	}
	// A new manager, as after an agent restart, checks it.
	again := &Manager{Root: m.Root}
	if _, err := again.Setup(context.Background(), pod); err == nil || !strings.Contains(err.Error(), "is not a directory, it's a File") {
		t.Errorf("Setup by a new manager = %v, want the type checked", err)
	}
}
