package stage2

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/need"
)

// fakeBlock writes a sysfs block directory holding devices with the given
// uevent files, by device name.
func fakeBlock(t *testing.T, uevents map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, uevent := range uevents {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "uevent"), []byte(uevent), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestFindPartitionByLabel reads the partitions' GPT labels from their
// uevent files, as the kernel writes them in sysfs.
func TestFindPartitionByLabel(t *testing.T) {
	dir := fakeBlock(t, map[string]string{
		"vda":  "MAJOR=253\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk\n",
		"vda1": "MAJOR=253\nMINOR=1\nDEVNAME=vda1\nDEVTYPE=partition\nPARTN=1\nPARTNAME=EFI\n",
		"vda4": "MAJOR=253\nMINOR=4\nDEVNAME=vda4\nDEVTYPE=partition\nPARTN=4\nPARTNAME=STATE\n",
	})
	if dev, err := findPartition(dir, "STATE", time.Second); err != nil || dev != "/dev/vda4" {
		t.Errorf("findPartition(STATE) = %q, %v; want /dev/vda4", dev, err)
	}
	start := time.Now()
	_, err := findPartition(dir, "EPHEMERAL", 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "no partition labelled EPHEMERAL after 200ms") || !strings.Contains(err.Error(), "vda4 STATE") {
		t.Errorf("findPartition(EPHEMERAL) = %v, want none after 200ms, naming the partitions seen", err)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("findPartition(EPHEMERAL) gave up after %s, want it to wait 200ms", took)
	}
}

// TestFindPartitionOnUevent: a partition listed while findPartition waits
// is found on the next block uevent from the kernel, here a "change" of a
// loop device of the test's. (The kernel here may not read GPT labels
// itself, so the partition is listed in a sysfs tree of the test's.)
func TestFindPartitionOnUevent(t *testing.T) {
	need.Root(t, "loop devices and uevents")
	losetup := need.Tool(t, "losetup", "util-linux")
	file := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(losetup, "--find", "--show", file).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command(losetup, "-d", loop).Run() })

	dir := fakeBlock(t, map[string]string{"vda": "DEVNAME=vda\nDEVTYPE=disk\n"})
	type found struct {
		dev string
		err error
	}
	done := make(chan found, 1)
	go func() {
		dev, err := findPartition(dir, "STATE", time.Minute)
		done <- found{dev, err}
	}()
	if err := os.MkdirAll(filepath.Join(dir, "vda4"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vda4", "uevent"), []byte("DEVNAME=vda4\nDEVTYPE=partition\nPARTNAME=STATE\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The uevent may come before findPartition listens: send one until it
	// has heard one.
	trigger := filepath.Join(sysBlock, filepath.Base(loop), "uevent")
	for range 30 {
		if err := os.WriteFile(trigger, []byte("change"), 0o200); err != nil {
			t.Fatal(err)
		}
		select {
		case f := <-done:
			if f.err != nil || f.dev != "/dev/vda4" {
				t.Errorf("findPartition(STATE) = %q, %v; want /dev/vda4", f.dev, f.err)
			}
			return
		case <-time.After(time.Second):
		}
	}
	t.Fatal("findPartition still waiting after 30 uevents")
}
