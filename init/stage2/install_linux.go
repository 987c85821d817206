package stage2

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/image"
	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/machineconfig"
)

// A machine booted from a Cairn ISO installs the disk it carries: init
// finds the install medium (image.MediumLabel) among the block devices,
// picks the disk that the medium's machine.install names, writes the
// disk onto it and reboots into it. A machine where a disk holds STATE
// is installed already and boots as usual, medium or not.

// mediumWait bounds the wait for STATE or an install medium to appear.
const mediumWait = partitionWait

// installScratch is where the installer unpacks the medium, in /run.
const installScratch = "/run/cairn-install"

// blockDisk is a whole disk the installer may write to.
type blockDisk struct {
	name          string // in sysBlock: vda, nvme0n1
	dev           string // /dev/vda
	size          int64  // bytes
	model, serial string
}

func (d blockDisk) String() string {
	s := fmt.Sprintf("%s (%s", d.dev, humanBytes(d.size))
	if d.model != "" {
		s += ", model " + d.model
	}
	if d.serial != "" {
		s += ", serial " + d.serial
	}
	return s + ")"
}

// humanBytes writes n bytes in GiB or MiB.
func humanBytes(n int64) string {
	if n >= 1<<30 {
		return strconv.FormatFloat(float64(n)/(1<<30), 'f', 1, 64) + " GiB"
	}
	return strconv.FormatInt(n>>20, 10) + " MiB"
}

// findMedium waits up to timeout for a partition labelled STATE (the
// machine is installed: "" is returned) or an install medium among the
// block devices named in sysBlock (found in devDir), and returns the
// medium's device.
func findMedium(sysBlock, devDir string, timeout time.Duration) (string, error) {
	var medium, state string
	err := waitBlock(timeout, func() bool {
		if state, _ = scanPartitions(sysBlock, "STATE"); state != "" {
			return true
		}
		entries, _ := os.ReadDir(sysBlock)
		for _, e := range entries {
			m, err := image.OpenMedium(filepath.Join(devDir, e.Name()))
			if err == nil {
				m.Close()
				medium = filepath.Join(devDir, e.Name())
				return true
			}
		}
		return false
	})
	if state != "" || errors.Is(err, os.ErrDeadlineExceeded) {
		return "", nil // installed, or neither: the boot says what is missing
	}
	return medium, err
}

// install installs the disk of the medium at mediumDev onto the disk its
// machine config names, using scratch for the unpacked medium, and with
// efivars set (the firmware's variables, efivarfs) makes the firmware boot
// it first. It writes nothing to a disk it refuses.
func install(ctx context.Context, sysBlock, devDir, mediumDev, scratch, efivars string) (blockDisk, error) {
	m, err := image.OpenMedium(mediumDev)
	if err != nil {
		return blockDisk{}, err
	}
	defer m.Close()
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return blockDisk{}, err
	}
	defer os.RemoveAll(scratch)
	u, err := image.Unpack(m, scratch)
	if err != nil {
		return blockDisk{}, err
	}
	data, err := u.StateFile("/" + filepath.Base(layout.MachineConfig))
	if errors.Is(err, os.ErrNotExist) {
		return blockDisk{}, errors.New("the install medium holds no machine config: build the ISO from one that sets machine.install (cairn image build -c FILE --format iso)")
	}
	if err != nil {
		return blockDisk{}, err
	}
	cfg, err := machineconfig.Parse(data)
	if err != nil {
		return blockDisk{}, fmt.Errorf("the install medium's machine config: %w", err)
	}
	disks, err := listDisks(sysBlock, devDir, filepath.Base(mediumDev))
	if err != nil {
		return blockDisk{}, err
	}
	target, err := pickDisk(cfg.Machine.Install, disks)
	if err != nil {
		return blockDisk{}, err
	}
	if target.size < image.MinInstallSize {
		return target, fmt.Errorf("disk %s is too small: a Cairn disk needs at least %s", target, humanBytes(image.MinInstallSize))
	}
	dev, err := os.OpenFile(target.dev, os.O_RDWR|os.O_EXCL, 0)
	if err != nil {
		return target, fmt.Errorf("disk %s: %w", target, err)
	}
	defer dev.Close()
	if what, err := inUse(dev); err != nil {
		return target, fmt.Errorf("disk %s: %w", target, err)
	} else if what != "" && !cfg.Machine.Install.Wipe {
		return target, fmt.Errorf("disk %s holds %s: set machine.install.wipe to overwrite it, or name another disk", target, what)
	}
	slog.Info("installing", "disk", target.String(), "from", mediumDev)
	if err := u.Install(ctx, m, dev, target.size); err != nil {
		return target, fmt.Errorf("installing onto %s: %w", target, err)
	}
	if err := dev.Close(); err != nil {
		return target, err
	}
	if efivars != "" {
		esp, err := u.ESP()
		if err == nil {
			var entry string
			entry, err = addBootEntry(efivars, esp)
			if err == nil {
				slog.Info("boot entry written, first in the firmware's boot order", "entry", entry, "loader", bootLoaderPath)
			}
		}
		if err != nil {
			slog.Warn("the firmware's boot entry could not be written: the disk boots only where the firmware tries its default path", "err", err)
		}
	}
	return target, nil
}

// listDisks returns the whole disks named in sysBlock that the installer
// may write to, by name: not the medium, not read-only, not a partition,
// a loop, RAM or optical device.
func listDisks(sysBlock, devDir, medium string) ([]blockDisk, error) {
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil, err
	}
	read := func(name, file string) string {
		b, _ := os.ReadFile(filepath.Join(sysBlock, name, file))
		return strings.TrimSpace(string(b))
	}
	var disks []blockDisk
	for _, e := range entries {
		name := e.Name()
		if name == medium || read(name, "ro") == "1" || read(name, "partition") != "" ||
			slices.ContainsFunc([]string{"loop", "ram", "sr", "zram", "nbd"}, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		sectors, err := strconv.ParseInt(read(name, "size"), 10, 64)
		if err != nil || sectors == 0 {
			continue
		}
		serial := read(name, "serial")
		if serial == "" {
			serial = read(name, "device/serial")
		}
		disks = append(disks, blockDisk{name: name, dev: filepath.Join(devDir, name), size: sectors * 512,
			model: read(name, "device/model"), serial: serial})
	}
	return disks, nil
}

// pickDisk returns the disk of disks that in names; their list for an
// error that none is.
func pickDisk(in machineconfig.Install, disks []blockDisk) (blockDisk, error) {
	var names []string
	for _, d := range disks {
		names = append(names, d.String())
	}
	seen := "disks: " + strings.Join(names, ", ")
	if len(names) == 0 {
		seen = "no disk seen"
	}
	switch {
	case in.Disk != "":
		dev := in.Disk
		if p, err := filepath.EvalSymlinks(dev); err == nil {
			dev = p
		}
		for _, d := range disks {
			if "/dev/"+d.name == dev {
				return d, nil
			}
		}
		return blockDisk{}, fmt.Errorf("machine.install.disk %s: no such disk (%s)", in.Disk, seen)
	case in.DiskSelector != nil:
		s := in.DiskSelector
		sizeOK := func(int64) bool { return true }
		if s.Size != "" {
			var err error
			if sizeOK, err = machineconfig.SizeMatch(s.Size); err != nil {
				return blockDisk{}, fmt.Errorf("machine.install.diskSelector.size: %w", err)
			}
		}
		for _, d := range disks {
			if sizeOK(d.size) && globMatch(s.Model, d.model) && globMatch(s.Serial, d.serial) {
				return d, nil
			}
		}
		return blockDisk{}, fmt.Errorf("machine.install.diskSelector: no disk matches (%s)", seen)
	}
	return blockDisk{}, fmt.Errorf("machine.install names no disk: set machine.install.disk or diskSelector in the config the ISO is built from (%s)", seen)
}

// globMatch matches s against the shell pattern pat; an empty pat
// matches anything.
func globMatch(pat, s string) bool {
	ok, _ := path.Match(pat, s)
	return pat == "" || ok
}

// inUse says what the disk holds in its first MiB, where partition tables
// and filesystems start: "" when it is all zeros.
func inUse(dev io.ReaderAt) (string, error) {
	head := make([]byte, 1<<20)
	n, err := dev.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("reading its first MiB: %w", err)
	}
	head = head[:n]
	switch {
	case len(head) >= 520 && string(head[512:520]) == "EFI PART":
		return "a GPT partition table", nil
	case len(head) >= 512 && head[510] == 0x55 && head[511] == 0xaa:
		return "a partition table or boot sector", nil
	case !bytes.Equal(head, make([]byte, len(head))):
		return "data in its first MiB (a filesystem?)", nil
	}
	return "", nil
}

// installStep is the boot step that installs from a medium: nothing when
// there is none. It returns the disk installed onto.
func (n *node) installStep() (string, error) {
	medium, err := findMedium(sysBlock, "/dev", mediumWait)
	if err != nil || medium == "" {
		return "", err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	boot.Go("stop the install at the shutdown", func() {
		select {
		case <-n.stop:
			cancel()
		case <-ctx.Done():
		}
	})
	start := time.Now()
	efivars, err := mountEfivars(true)
	if err != nil {
		slog.Warn("no boot entry will be written", "err", err)
	}
	target, err := install(ctx, sysBlock, "/dev", medium, installScratch, efivars)
	if efivars != "" {
		unix.Unmount(efivars, 0)
	}
	if err != nil {
		return "", err
	}
	slog.Info("installed: rebooting into the disk", "disk", target.String(), "took", time.Since(start).Round(100*time.Millisecond))
	return target.dev, nil
}
