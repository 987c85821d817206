package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/test/need"
)

// inMountNamespace runs the calling test again, alone, in a child process
// in a mount namespace of its own, and reports whether this is that child:
// the parent only checks how the child did. The child's mounts are not
// seen by the host and end with it.
func inMountNamespace(t *testing.T) bool {
	t.Helper()
	if os.Getenv("CAIRN_MOUNTNS_CHILD") == t.Name() {
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			t.Fatal(err)
		}
		return true
	}
	need.Root(t, "a mount namespace")
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "CAIRN_MOUNTNS_CHILD="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in a mount namespace: %v\n%s", t.Name(), err, out)
	}
	return false
}

// TestMountRootAndEtcOverlay mounts a real squashfs root as stage 1 does,
// through a loop device, and the /etc overlay on it: the root is read-only,
// /etc is writable, its writes land in the tmpfs upper layer, and the
// image's own /etc shows through.
func TestMountRootAndEtcOverlay(t *testing.T) {
	if !inMountNamespace(t) {
		return
	}
	mksquashfs := need.Tool(t, "mksquashfs", "squashfs-tools")
	tree, dir := t.TempDir(), t.TempDir()
	for _, d := range []string{"etc", "sbin", overlayDir} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tree, "etc", "os-release"), []byte("ID=cairn\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(t.TempDir(), "rootfs.sqsh")
	if out, err := exec.Command(mksquashfs, tree, image, "-quiet", "-noappend").CombinedOutput(); err != nil {
		t.Fatalf("mksquashfs: %v\n%s", err, out)
	}
	root := filepath.Join(dir, "newroot")
	if err := mountRoot(image, root); err != nil {
		t.Fatalf("mountRoot() = %v", err)
	}
	t.Cleanup(func() { detachLoops(t, image) })
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(root, "sbin", "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("writing to the root = %v, want EROFS: the root is read-only", err)
	}

	if err := mountEtcOverlay(root); err != nil {
		t.Fatalf("mountEtcOverlay() = %v", err)
	}
	t.Cleanup(func() {
		unix.Unmount(filepath.Join(root, "etc"), unix.MNT_DETACH)
		unix.Unmount(filepath.Join(root, overlayDir), unix.MNT_DETACH)
	})
	if got, err := os.ReadFile(filepath.Join(root, "etc", "os-release")); err != nil || string(got) != "ID=cairn\n" {
		t.Errorf("/etc/os-release through the overlay = %q, %v; want the image's", got, err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("node\n"), 0o644); err != nil {
		t.Fatalf("writing to /etc = %v, want it writable", err)
	}
	if got, err := os.ReadFile(filepath.Join(root, overlayDir, "etc", "hostname")); err != nil || string(got) != "node\n" {
		t.Errorf("upper layer's hostname = %q, %v; want the write to /etc there", got, err)
	}
	if mounts, _ := os.ReadFile("/proc/self/mounts"); !strings.Contains(string(mounts), "tmpfs "+filepath.Join(root, overlayDir)+" tmpfs") {
		t.Errorf("no tmpfs on %s in /proc/self/mounts:\n%s", overlayDir, mounts)
	}
}

// TestMountRootMissingImage: without an image, the step says which.
func TestMountRootMissingImage(t *testing.T) {
	need.Root(t, "loop devices")
	missing := filepath.Join(t.TempDir(), "rootfs.sqsh")
	err := mountRoot(missing, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("mountRoot(missing image) = %v, want an error naming %s", err, missing)
	}
}

// detachLoops detaches the loop devices backed by file.
func detachLoops(t *testing.T, file string) {
	out, err := exec.Command("losetup", "-j", file).Output()
	if err != nil {
		t.Errorf("losetup -j %s: %v", file, err)
		return
	}
	for line := range strings.Lines(string(out)) {
		if dev, _, ok := strings.Cut(line, ":"); ok {
			if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
				t.Errorf("losetup -d %s: %v\n%s", dev, err, out)
			}
		}
	}
}
