package image

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// loaderConf is systemd-boot's loader.conf. It names no default entry on
// purpose: systemd-boot then picks the newest UKI that has boot tries left,
// which is what makes boot counting fall back to the previous version.
const loaderConf = "timeout 0\n"

// ESP describes the EFI system partition of a Cairn disk: systemd-boot
// and the UKIs it boots. It depends on nothing of a machine's config but
// its kernel arguments (in the UKI), so that the disks of many machines
// share it.
type ESP struct {
	Bootloader      string            // path to systemd-bootx64.efi
	UKIs            map[string]string // name in EFI/Linux/ (e.g. "cairn-0.1.0.efi") -> path
	SourceDateEpoch int64             // every timestamp, in seconds since 1970
	Seed            []byte            // digest of its inputs; the volume ID is derived from it
	// Enroll are the Secure Boot keys' signed variable updates
	// (SecureBootKeys.WriteEnrollment), by name in loader/keys/auto:
	// systemd-boot enrolls them while the firmware is in setup mode.
	Enroll map[string]string
}

// validate checks e.
func (e ESP) validate() error {
	switch {
	case e.Bootloader == "":
		return errors.New("no bootloader")
	case len(e.UKIs) == 0:
		return errors.New("no UKIs")
	case len(e.Seed) == 0:
		return errors.New("no seed")
	case e.SourceDateEpoch < minEpoch || e.SourceDateEpoch > maxEpoch:
		return errEpoch(e.SourceDateEpoch)
	}
	folded := map[string]bool{} // FAT file names ignore case
	for name := range e.UKIs {
		if !ukiName.MatchString(name) || folded[strings.ToLower(name)] {
			return fmt.Errorf("UKI name %q: must be unique ignoring case, end in .efi and use only letters, digits, '.', '_' and '-'", name)
		}
		folded[strings.ToLower(name)] = true
	}
	return nil
}

// WriteESP writes the FAT32 image of the EFI system partition e to out,
// the same bytes for the same e. The filesystem is made by mkfs.vfat and
// filled by mtools; mtools takes every timestamp from SOURCE_DATE_EPOCH,
// read as UTC.
func WriteESP(ctx context.Context, e ESP, out string) error {
	if err := e.validate(); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(filepath.Dir(out), ".cairn-esp-")
	if err != nil {
		return fmt.Errorf("creating work directory: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := writeESP(ctx, dir, e, out); err != nil {
		return fmt.Errorf("building EFI system partition: %w", err)
	}
	return nil
}

func writeESP(ctx context.Context, dir string, e ESP, img string) error {
	if err := createSparse(img, espSize); err != nil {
		return err
	}
	id := deriveID(e.Seed, "filesystem EFI")
	// --invariant must come before -i, or it replaces the volume ID.
	if _, _, err := mkfsVfat.run(ctx, nil, "-F", "32", "-n", "EFI", "--invariant",
		"-i", fmt.Sprintf("%08x", binary.BigEndian.Uint32(id[:4])), "-h", strconv.FormatInt(espStart/sectorSize, 10), img); err != nil {
		return err
	}

	conf := filepath.Join(dir, "loader.conf")
	dirs := []string{"::/EFI", "::/EFI/BOOT", "::/EFI/Linux", "::/loader"}
	confText := loaderConf
	if len(e.Enroll) > 0 {
		// force: without asking, as a VM's or a new machine's first boot
		// needs; systemd-boot reboots once they are in.
		confText += "secure-boot-enroll force\n"
		dirs = append(dirs, "::/loader/keys", "::/loader/keys/auto")
	}
	if err := os.WriteFile(conf, []byte(confText), 0o644); err != nil {
		return fmt.Errorf("writing loader.conf: %w", err)
	}
	env := []string{"MTOOLS_SKIP_CHECK=1", "SOURCE_DATE_EPOCH=" + strconv.FormatInt(e.SourceDateEpoch, 10)}
	if _, _, err := mmd.run(ctx, env, append([]string{"-i", img}, dirs...)...); err != nil {
		return err
	}
	copies := [][2]string{
		{e.Bootloader, "::/EFI/BOOT/BOOTX64.EFI"},
		{conf, "::/loader/loader.conf"},
	}
	for _, name := range slices.Sorted(maps.Keys(e.UKIs)) {
		copies = append(copies, [2]string{e.UKIs[name], "::/EFI/Linux/" + name})
	}
	for _, name := range slices.Sorted(maps.Keys(e.Enroll)) {
		copies = append(copies, [2]string{e.Enroll[name], "::/loader/keys/auto/" + name})
	}
	for _, c := range copies {
		if _, _, err := mcopy.run(ctx, env, "-i", img, c[0], c[1]); err != nil {
			return err
		}
	}
	return nil
}
