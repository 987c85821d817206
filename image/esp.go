package image

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// loaderConf is systemd-boot's loader.conf. It names no default entry on
// purpose: systemd-boot then picks the newest UKI that has boot tries left,
// which is what makes boot counting fall back to the previous version.
const loaderConf = "timeout 0\n"

// buildESP makes the FAT32 EFI system partition image in dir and returns its
// path. The filesystem is made by mkfs.vfat and filled by mtools; mtools
// takes every timestamp from SOURCE_DATE_EPOCH, read as UTC.
func buildESP(ctx context.Context, dir string, d Disk, volumeID uint32, startLBA int64) (string, error) {
	img := filepath.Join(dir, "esp.img")
	if err := createSparse(img, espSize); err != nil {
		return "", err
	}
	// --invariant must come before -i, or it replaces the volume ID.
	if _, _, err := mkfsVfat.run(ctx, nil, "-F", "32", "-n", "EFI", "--invariant",
		"-i", fmt.Sprintf("%08x", volumeID), "-h", strconv.FormatInt(startLBA, 10), img); err != nil {
		return "", err
	}

	conf := filepath.Join(dir, "loader.conf")
	if err := os.WriteFile(conf, []byte(loaderConf), 0o644); err != nil {
		return "", fmt.Errorf("writing loader.conf: %w", err)
	}
	env := []string{"MTOOLS_SKIP_CHECK=1", "SOURCE_DATE_EPOCH=" + strconv.FormatInt(d.SourceDateEpoch, 10)}
	if _, _, err := mmd.run(ctx, env, "-i", img, "::/EFI", "::/EFI/BOOT", "::/EFI/Linux", "::/loader"); err != nil {
		return "", err
	}
	copies := [][2]string{
		{d.Bootloader, "::/EFI/BOOT/BOOTX64.EFI"},
		{conf, "::/loader/loader.conf"},
	}
	for _, name := range slices.Sorted(maps.Keys(d.UKIs)) {
		copies = append(copies, [2]string{d.UKIs[name], "::/EFI/Linux/" + name})
	}
	for _, c := range copies {
		if _, _, err := mcopy.run(ctx, env, "-i", img, c[0], c[1]); err != nil {
			return "", err
		}
	}
	return img, nil
}
