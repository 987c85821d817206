package image

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// NoCloudLabel is the label of a NoCloud volume's filesystem, by which a
// node finds it.
const NoCloudLabel = "CIDATA"

// NoCloud is a NoCloud volume: a small FAT filesystem labelled CIDATA
// holding user-data, a machine config, and meta-data, what cloud and
// virtualization platforms attach to a VM. A generic image (one with no
// config on STATE) takes its config from it at first boot.
type NoCloud struct {
	UserData, MetaData []byte
	SourceDateEpoch    int64 // every timestamp, in seconds since 1970
}

// minNoCloudSize is the least size of a NoCloud volume: mkfs.vfat makes
// FAT12 at this size, which every reader knows.
const minNoCloudSize = 2 << 20

// WriteNoCloud writes the NoCloud volume n to out, the same bytes for the
// same n.
func WriteNoCloud(ctx context.Context, n NoCloud, out string) error {
	if n.SourceDateEpoch < minEpoch || n.SourceDateEpoch > maxEpoch {
		return errEpoch(n.SourceDateEpoch)
	}
	dir, err := os.MkdirTemp(filepath.Dir(out), ".cairn-cidata-")
	if err != nil {
		return fmt.Errorf("creating work directory: %w", err)
	}
	defer os.RemoveAll(dir)
	img := filepath.Join(dir, "cidata.img")
	size := max(minNoCloudSize, int64(len(n.UserData)+len(n.MetaData))*2+1<<20) / mib * mib
	if err := createSparse(img, size); err != nil {
		return err
	}
	id := sha256.Sum256(append(append([]byte{}, n.UserData...), n.MetaData...))
	if _, _, err := mkfsVfat.run(ctx, nil, "-n", NoCloudLabel, "--invariant", "-i", fmt.Sprintf("%08x", binary.BigEndian.Uint32(id[:4])), img); err != nil {
		return err
	}
	env := []string{"MTOOLS_SKIP_CHECK=1", "SOURCE_DATE_EPOCH=" + strconv.FormatInt(n.SourceDateEpoch, 10)}
	for _, f := range []struct {
		name string
		data []byte
	}{{"user-data", n.UserData}, {"meta-data", n.MetaData}} { // in this order: the same directory
		p := filepath.Join(dir, f.name)
		if err := os.WriteFile(p, f.data, 0o644); err != nil {
			return err
		}
		if _, _, err := mcopy.run(ctx, env, "-i", img, p, "::/"+f.name); err != nil {
			return err
		}
	}
	if err := os.Rename(img, out); err != nil {
		return fmt.Errorf("moving the NoCloud volume into place: %w", err)
	}
	return nil
}
