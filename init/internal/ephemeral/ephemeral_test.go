package ephemeral

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskfs/go-diskfs/partition/gpt"
)

// newDisk writes a GPT image like the image build's: EFI and STATE.
func newDisk(t *testing.T, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	table := &gpt.Table{ProtectiveMBR: true, LogicalSectorSize: 512, PhysicalSectorSize: 512, Partitions: []*gpt.Partition{
		{Index: 1, Start: 2048, End: 2048 + 256*2048 - 1, Type: gpt.EFISystemPartition, Name: "EFI"},
		{Index: 2, Start: 2048 + 256*2048, End: 2048 + 356*2048 - 1, Type: gpt.LinuxFilesystem, Name: "STATE"},
	}}
	if err := table.Write(f, size); err != nil {
		t.Fatal(err)
	}
	return path
}

func partitions(t *testing.T, path string) []*gpt.Partition {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	table, err := gpt.Read(f, 512, 512)
	if err != nil {
		t.Fatal(err)
	}
	var ps []*gpt.Partition
	for _, p := range table.Partitions {
		if p.Type != gpt.Unused {
			ps = append(ps, p)
		}
	}
	return ps
}

// sgdiskVerify checks the table with sgdisk, when it is installed.
func sgdiskVerify(t *testing.T, path string) {
	t.Helper()
	if _, err := exec.LookPath("sgdisk"); err != nil {
		t.Log("sgdisk not found (Debian package gdisk): skipping its check")
		return
	}
	out, err := exec.Command("sgdisk", "-v", path).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "No problems found") {
		t.Errorf("sgdisk -v %s: %v\n%s", path, err, out)
	}
}

func TestCreateThenGrow(t *testing.T) {
	path := newDisk(t, 1<<30)
	res, err := Ensure(path)
	if err != nil {
		t.Fatal(err)
	}
	if res.Change != Created || res.Number != 3 {
		t.Fatalf("Ensure() on a new disk = %+v, want Created as partition 3", res)
	}
	ps := partitions(t, path)
	eph := ps[2]
	if eph.Name != Label || eph.Start != 2048+356*2048 || eph.Start%2048 != 0 || (eph.End+1)%2048 != 0 {
		t.Errorf("EPHEMERAL = %+v, want it 1 MiB aligned right after STATE", eph)
	}
	if ps[0].Name != "EFI" || ps[1].Name != "STATE" || ps[1].End != 2048+356*2048-1 {
		t.Errorf("other partitions changed: %+v %+v", ps[0], ps[1])
	}
	sgdiskVerify(t, path)
	firstSize := res.Size

	// Nothing to do on the next boot.
	if res, err := Ensure(path); err != nil || res.Change != Unchanged || res.Size != firstSize {
		t.Errorf("second Ensure() = %+v, %v; want Unchanged, size %d", res, err, firstSize)
	}

	// The disk grows by 1 GiB: EPHEMERAL follows.
	if err := os.Truncate(path, 2<<30); err != nil {
		t.Fatal(err)
	}
	res, err = Ensure(path)
	if err != nil {
		t.Fatal(err)
	}
	if res.Change != Grown || res.Size < firstSize+(1<<30)-(2<<20) {
		t.Errorf("Ensure() after growing the disk = %+v, want Grown by about 1 GiB from %d", res, firstSize)
	}
	if got := partitions(t, path)[2].Start; got != eph.Start {
		t.Errorf("EPHEMERAL moved from sector %d to %d, want it kept in place", eph.Start, got)
	}
	sgdiskVerify(t, path)
}

func TestNoRoom(t *testing.T) {
	path := newDisk(t, 358*1<<20) // ends right after STATE
	if _, err := Ensure(path); err == nil || !strings.Contains(err.Error(), "no room") {
		t.Errorf("Ensure() on a full disk = %v, want a no-room error", err)
	}
}

// TestRemove takes EPHEMERAL out, its start zeroed and the rest of the
// disk untouched, and the next Ensure makes it anew in the same place.
func TestRemove(t *testing.T) {
	path := newDisk(t, 1<<30)
	if ok, err := Remove(path); ok || err != nil {
		t.Fatalf("Remove() with no EPHEMERAL = %v, %v; want false, nil", ok, err)
	}
	res, err := Ensure(path)
	if err != nil {
		t.Fatal(err)
	}
	eph := partitions(t, path)[2]
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	at := int64(eph.Start) * sectorSize
	if _, err := f.WriteAt([]byte("an old filesystem"), at+1024); err != nil {
		t.Fatal(err)
	}
	if ok, err := Remove(path); !ok || err != nil {
		t.Fatalf("Remove() = %v, %v; want true, nil", ok, err)
	}
	if ps := partitions(t, path); len(ps) != 2 || ps[0].Name != "EFI" || ps[1].Name != "STATE" {
		t.Errorf("partitions after Remove: %+v, want EFI and STATE", ps)
	}
	buf := make([]byte, 64)
	if _, err := f.ReadAt(buf, at+1024); err != nil || strings.Trim(string(buf), "\x00") != "" {
		t.Errorf("EPHEMERAL's start after Remove: %q, %v; want zeros", buf, err)
	}
	sgdiskVerify(t, path)
	again, err := Ensure(path)
	if err != nil || again.Change != Created || again.Number != res.Number || again.Size != res.Size {
		t.Errorf("Ensure() after Remove = %+v, %v; want Created as %+v", again, err, res)
	}
}
