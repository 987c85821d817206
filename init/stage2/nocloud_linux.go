package stage2

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/filesystem/fat12"
	"github.com/diskfs/go-diskfs/filesystem/fat16"
	"github.com/diskfs/go-diskfs/filesystem/fat32"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"

	"github.com/cairn-os/cairn/internal/atomicfile"
	"github.com/cairn-os/cairn/machineconfig"
	"sigs.k8s.io/yaml"
)

// A NoCloud volume gives a node whose STATE holds no machine config its
// first one, so that one generic image serves many machines: a vfat or
// iso9660 filesystem labelled CIDATA whose user-data file is the machine
// config, what cloud and virtualization platforms attach. Its config is
// validated and written to STATE as the running and the first-boot
// config: later boots, and a reset, use it without the volume.
const noCloudLabel = "CIDATA"

// noCloudFirstBoot gives STATE the machine config of a NoCloud volume
// among the block devices named in sysBlock (found in devDir) when STATE
// has none at statePath; firstBootPath gets it too. It returns the volume
// it took the config from, "" when STATE had a config. An invalid config
// is written nowhere: its error has the field paths.
func noCloudFirstBoot(sysBlock, devDir, statePath, firstBootPath string) (string, error) {
	if has, err := stateHasConfig(statePath); has || err != nil {
		return "", err
	}
	dev, data, meta, err := findNoCloud(sysBlock, devDir)
	if err != nil {
		return "", err
	}
	if data, err = withLocalHostname(data, meta); err != nil {
		return "", fmt.Errorf("NoCloud volume %s: %w", dev, err)
	}
	if _, err := machineconfig.Parse(data); err != nil {
		return "", fmt.Errorf("NoCloud volume %s: user-data: %w", dev, err)
	}
	return dev, keepFirstBootConfig(data, statePath, firstBootPath)
}

// stateHasConfig says whether STATE holds a machine config at statePath.
func stateHasConfig(statePath string) (bool, error) {
	_, err := os.Stat(statePath)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// keepFirstBootConfig writes a node's first config, from wherever it came,
// to STATE: first-boot.yaml first, so that a power cut between the two
// leaves no config.yaml and the next boot looks for it again.
func keepFirstBootConfig(data []byte, statePath, firstBootPath string) error {
	for _, p := range []string{firstBootPath, statePath} {
		if err := atomicfile.WriteFile(p, data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// findNoCloud returns the device of the filesystem labelled CIDATA among
// the block devices named in sysBlock, and its user-data. go-diskfs reads
// the filesystems (vfat, iso9660): nothing is mounted, and no kernel
// module is needed.
func findNoCloud(sysBlock, devDir string) (dev string, userData, metaData []byte, err error) {
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return "", nil, nil, err
	}
	for _, e := range entries {
		dev := filepath.Join(devDir, e.Name())
		fsys, closeDisk, err := openFilesystem(dev)
		if err != nil {
			continue // no filesystem go-diskfs reads
		}
		if !strings.EqualFold(strings.TrimSpace(fsys.Label()), noCloudLabel) {
			closeDisk()
			continue
		}
		data, err := readAll(fsys, "/user-data")
		meta, merr := readAll(fsys, "/meta-data")
		closeDisk()
		if err != nil {
			return "", nil, nil, fmt.Errorf("NoCloud volume %s: %w", dev, err)
		}
		if errors.Is(merr, fs.ErrNotExist) {
			meta, merr = nil, nil // meta-data is optional here
		}
		if merr != nil {
			return "", nil, nil, fmt.Errorf("NoCloud volume %s: %w", dev, merr)
		}
		return dev, data, meta, nil
	}
	return "", nil, nil, fmt.Errorf("STATE holds no machine config and no filesystem is labelled %s (a NoCloud volume): write one with `cairn image build -c FILE`, or attach one made by `cairn image cidata`", noCloudLabel)
}

// openFilesystem opens, read-only, the FAT or iso9660 filesystem that
// fills dev, with go-diskfs's readers of those alone.
func openFilesystem(dev string) (filesystem.FileSystem, func(), error) {
	f, err := os.Open(dev)
	if err != nil {
		return nil, nil, err
	}
	size, err := f.Seek(0, io.SeekEnd) // a block device's size too
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	b := file.New(f, true)
	closeFile := func() { f.Close() }
	if fsys, err := fat32.Read(b, size, 0, 0); err == nil {
		return fsys, closeFile, nil
	}
	if fsys, err := fat16.Read(b, size, 0, 0); err == nil {
		return fsys, closeFile, nil
	}
	if fsys, err := fat12.Read(b, size, 0, 0); err == nil {
		return fsys, closeFile, nil
	}
	// Block size 0: it finds its 2 KiB blocks itself.
	if fsys, err := iso9660.Read(b, size, 0, 0); err == nil {
		return fsys, closeFile, nil
	}
	f.Close()
	return nil, nil, errors.New("no FAT or iso9660 filesystem")
}

// readAll reads the file at path, in the root directory of fsys. It reads
// no more than the directory says the file holds: go-diskfs 1.9's FAT12
// reader returns a small file's whole cluster.
func readAll(fsys filesystem.FileSystem, path string) ([]byte, error) {
	entries, err := fsys.ReadDir(".")
	if err != nil {
		return nil, fmt.Errorf("read the root directory: %w", err)
	}
	i := slices.IndexFunc(entries, func(e fs.DirEntry) bool { return "/"+e.Name() == path })
	if i < 0 {
		return nil, fmt.Errorf("%s: %w", path, fs.ErrNotExist)
	}
	info, err := entries[i].Info()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f, err := fsys.OpenFile(path, os.O_RDONLY)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, info.Size()))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return data, nil
}

// withLocalHostname gives the machine config userData the local-hostname
// of the NoCloud meta-data when it names no machine.hostname itself: one
// user-data then serves many machines, each named by its meta-data.
func withLocalHostname(userData, metaData []byte) ([]byte, error) {
	var meta struct {
		LocalHostname string `json:"local-hostname"`
	}
	if err := yaml.Unmarshal(metaData, &meta); err != nil {
		return nil, fmt.Errorf("meta-data: %w", err)
	}
	var doc struct {
		Machine struct {
			Hostname string `json:"hostname"`
		} `json:"machine"`
	}
	if meta.LocalHostname == "" || yaml.Unmarshal(userData, &doc) != nil || doc.Machine.Hostname != "" {
		return userData, nil // validation says what is wrong with a config that does not decode
	}
	patch, err := json.Marshal(map[string]any{"machine": map[string]string{"hostname": meta.LocalHostname}})
	if err != nil {
		return nil, err
	}
	patched, err := machineconfig.ApplyPatch(userData, patch)
	if err != nil {
		return nil, fmt.Errorf("user-data: %w", err)
	}
	return yaml.JSONToYAML(patched)
}
