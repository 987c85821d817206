package stage2

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/diskfs/go-diskfs/partition/gpt"
	"sigs.k8s.io/yaml"

	"github.com/cairn-os/cairn/image"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/need"
)

// installISO writes a Cairn disk whose STATE holds the machine config doc
// (none if nil), converts it to an ISO with the real tools, and returns
// the ISO and the raw disk.
func installISO(t *testing.T, doc []byte) (iso, raw string) {
	t.Helper()
	const bootloader = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi"
	need.File(t, bootloader, "systemd-boot-efi")
	dir := t.TempDir()
	ctx := context.Background()
	uki := filepath.Join(dir, "uki.efi")
	if err := os.WriteFile(uki, bytes.Repeat([]byte("uki"), 1<<18), 0o644); err != nil {
		t.Fatal(err)
	}
	seed := sha256.Sum256(doc)
	esp := filepath.Join(dir, "esp.img")
	if err := image.WriteESP(ctx, image.ESP{Bootloader: bootloader, UKIs: map[string]string{"cairn.efi": uki}, SourceDateEpoch: 1700000000, Seed: seed[:]}, esp); err != nil {
		t.Fatal(err)
	}
	var state map[string][]byte
	if doc != nil {
		state = map[string][]byte{"config.yaml": doc}
	}
	raw = filepath.Join(dir, "disk.raw")
	if err := image.WriteRaw(ctx, image.Disk{Size: 1 << 30, ESP: esp, State: state, SourceDateEpoch: 1700000000, Seed: seed[:]}, raw); err != nil {
		t.Fatal(err)
	}
	f, err := image.FormatByName("iso")
	if err != nil {
		t.Fatal(err)
	}
	iso = filepath.Join(dir, "cairn.iso")
	if err := f.Convert(ctx, raw, iso); err != nil {
		t.Fatal(err)
	}
	return iso, raw
}

// installDoc is a valid machine config of node-1 with install as its
// machine.install.
func installDoc(t *testing.T, install machineconfig.Install) []byte {
	t.Helper()
	valid, _ := firstConfigs(t, "node-1")
	patch, err := json.Marshal(map[string]any{"machine": map[string]any{"install": install}})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := machineconfig.ApplyPatch(valid, patch)
	if err != nil {
		t.Fatal(err)
	}
	if doc, err = yaml.JSONToYAML(doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// fakeDisk is a disk in a test's sysfs and /dev: a sparse file.
type fakeDisk struct {
	name   string
	size   int64
	serial string
	ro     bool
	data   []byte // written at its start
}

// installBlock makes sysBlock and devDir for disks, and the medium iso as
// sr0, and returns them.
func installBlock(t *testing.T, iso string, disks ...fakeDisk) (sysBlock, devDir string) {
	t.Helper()
	sysBlock, devDir = t.TempDir(), t.TempDir()
	write := func(name, file, content string) {
		p := filepath.Join(sysBlock, name, file)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range disks {
		write(d.name, "size", strconv.FormatInt(d.size/512, 10))
		write(d.name, "serial", d.serial)
		write(d.name, "device/model", "QEMU HARDDISK")
		if d.ro {
			write(d.name, "ro", "1")
		}
		p := filepath.Join(devDir, d.name)
		if err := os.WriteFile(p, d.data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, d.size); err != nil {
			t.Fatal(err)
		}
	}
	write("sr0", "size", "1000")
	if err := os.Symlink(iso, filepath.Join(devDir, "sr0")); err != nil {
		t.Fatal(err)
	}
	return sysBlock, devDir
}

// TestInstall installs the disk of a real ISO onto the disk its config
// names, by path or by selector, and refuses, writing nothing, a disk
// that is missing, too small or in use (unless wipe), and a medium with
// no config.
func TestInstall(t *testing.T) {
	const gib = 1 << 30
	ctx := context.Background()

	t.Run("by path", func(t *testing.T) {
		iso, raw := installISO(t, installDoc(t, machineconfig.Install{Disk: "/dev/vdb"}))
		sys, dev := installBlock(t, iso, fakeDisk{name: "vda", size: 2 * gib, ro: true}, fakeDisk{name: "vdb", size: 2 * gib, serial: "b"})
		efivars := t.TempDir()
		got, err := install(ctx, sys, dev, filepath.Join(dev, "sr0"), t.TempDir(), efivars)
		if err != nil {
			t.Fatal(err)
		}
		if got.name != "vdb" {
			t.Errorf("installed onto %s, want vdb", got)
		}
		checkInstalled(t, raw, filepath.Join(dev, "vdb"))
		// The boot entry names the installed ESP.
		entry, err := os.ReadFile(filepath.Join(efivars, "Boot0000-"+efiGlobal))
		if err != nil {
			t.Fatal(err)
		}
		esp := readGPT(t, raw).Partitions[0]
		if want, _ := loadOption(image.Partition{Number: 1, Start: esp.Start, Sectors: uint64(esp.GetSize()) / 512, GUID: esp.GUID}); !bytes.Equal(entry[4:], want) {
			t.Error("Boot0000 does not name the installed EFI system partition")
		}
		if order := readBootOrder(t, efivars); !slices.Equal(order, []uint16{0}) {
			t.Errorf("BootOrder = %v, want [0]", order)
		}
	})

	t.Run("by selector", func(t *testing.T) {
		iso, raw := installISO(t, installDoc(t, machineconfig.Install{DiskSelector: &machineconfig.DiskSelector{Size: ">= 2Gi", Serial: "data-*"}}))
		sys, dev := installBlock(t, iso,
			fakeDisk{name: "vda", size: 4 * gib, serial: "boot-1"},
			fakeDisk{name: "vdb", size: gib, serial: "data-1"},
			fakeDisk{name: "vdc", size: 3 * gib, serial: "data-2"})
		got, err := install(ctx, sys, dev, filepath.Join(dev, "sr0"), t.TempDir(), "")
		if err != nil {
			t.Fatal(err)
		}
		if got.name != "vdc" {
			t.Errorf("installed onto %s, want vdc", got)
		}
		checkInstalled(t, raw, filepath.Join(dev, "vdc"))
	})

	used := []byte("an old filesystem")
	for _, tt := range []struct {
		name    string
		install machineconfig.Install
		disk    fakeDisk
		noDoc   bool
		want    string // in the error
	}{
		{name: "missing", install: machineconfig.Install{Disk: "/dev/vdz"}, disk: fakeDisk{name: "vda", size: 2 * gib, serial: "s1"},
			want: "machine.install.disk /dev/vdz: no such disk (disks: DEV/vda (2.0 GiB, model QEMU HARDDISK, serial s1))"},
		{name: "too small", install: machineconfig.Install{Disk: "/dev/vda"}, disk: fakeDisk{name: "vda", size: 300 << 20},
			want: "disk DEV/vda (300 MiB, model QEMU HARDDISK) is too small: a Cairn disk needs at least 422 MiB"},
		{name: "in use", install: machineconfig.Install{Disk: "/dev/vda"}, disk: fakeDisk{name: "vda", size: 2 * gib, data: used},
			want: "disk DEV/vda (2.0 GiB, model QEMU HARDDISK) holds data in its first MiB (a filesystem?): set machine.install.wipe to overwrite it, or name another disk"},
		{name: "no selector match", install: machineconfig.Install{DiskSelector: &machineconfig.DiskSelector{Model: "Samsung*"}}, disk: fakeDisk{name: "vda", size: 2 * gib},
			want: "machine.install.diskSelector: no disk matches (disks: DEV/vda (2.0 GiB, model QEMU HARDDISK))"},
		{name: "no install", disk: fakeDisk{name: "vda", size: 2 * gib},
			want: "machine.install names no disk: set machine.install.disk or diskSelector in the config the ISO is built from (disks: DEV/vda (2.0 GiB, model QEMU HARDDISK))"},
		{name: "no config", noDoc: true, disk: fakeDisk{name: "vda", size: 2 * gib},
			want: "the install medium holds no machine config"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			doc := installDoc(t, tt.install)
			if tt.noDoc {
				doc = nil
			}
			iso, _ := installISO(t, doc)
			sys, dev := installBlock(t, iso, tt.disk)
			before := diskDigest(t, filepath.Join(dev, tt.disk.name))
			_, err := install(ctx, sys, dev, filepath.Join(dev, "sr0"), t.TempDir(), "")
			if want := strings.ReplaceAll(tt.want, "DEV", dev); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("install: %v, want %q", err, want)
			}
			if diskDigest(t, filepath.Join(dev, tt.disk.name)) != before {
				t.Error("the refused disk was written")
			}
		})
	}

	t.Run("wipe", func(t *testing.T) {
		iso, raw := installISO(t, installDoc(t, machineconfig.Install{Disk: "/dev/vda", Wipe: true}))
		sys, dev := installBlock(t, iso, fakeDisk{name: "vda", size: 2 * gib, data: used})
		if _, err := install(ctx, sys, dev, filepath.Join(dev, "sr0"), t.TempDir(), ""); err != nil {
			t.Fatal(err)
		}
		checkInstalled(t, raw, filepath.Join(dev, "vda"))
	})
}

// checkInstalled checks that disk has raw's partitions, with their bytes.
func checkInstalled(t *testing.T, raw, disk string) {
	t.Helper()
	want, got := readGPT(t, raw), readGPT(t, disk)
	if got.GUID != want.GUID || len(got.Partitions) != len(want.Partitions) {
		t.Fatalf("installed disk %s with %d partitions, want the image's %s with %d", got.GUID, len(got.Partitions), want.GUID, len(want.Partitions))
	}
	for i, p := range want.Partitions {
		if g := got.Partitions[i]; g.Name != p.Name || g.GUID != p.GUID || g.Start != p.Start {
			t.Errorf("partition %d: %s %s at %d, want %s %s at %d", i+1, g.Name, g.GUID, g.Start, p.Name, p.GUID, p.Start)
		}
		if !bytes.Equal(readRange(t, raw, p.GetStart(), p.GetSize()), readRange(t, disk, p.GetStart(), p.GetSize())) {
			t.Errorf("partition %s: not the image's bytes", p.Name)
		}
	}
}

func readGPT(t *testing.T, path string) *gpt.Table {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	table, err := gpt.Read(f, 512, 512)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return table
}

func readRange(t *testing.T, path string, off, size int64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, off, size))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// diskDigest is the digest of the sparse disk file at path, read
// without its holes.
func diskDigest(t *testing.T, path string) string {
	t.Helper()
	a, err := image.DiskArtifact(context.Background(), "disk", path)
	if err != nil {
		t.Fatal(err)
	}
	return a.SHA256
}
