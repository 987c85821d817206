package image

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"
)

// buildState makes the ext4 STATE partition image in dir, holding files, and
// returns its path.
//
// mke2fs -d copies each file's owner and times from the tree it is given, so
// they would be the builder's uid and the time of the build (ctime and atime
// cannot be set from user space). A debugfs script then gives every inode
// fixed metadata; E2FSPROGS_FAKE_TIME fixes the times mke2fs and debugfs
// write on their own.
func buildState(ctx context.Context, dir string, files map[string][]byte, epoch int64, id, hashSeed uuid.UUID) (string, error) {
	root := filepath.Join(dir, "state")
	if err := os.Mkdir(root, 0o700); err != nil {
		return "", fmt.Errorf("creating STATE tree: %w", err)
	}
	paths := slices.Sorted(maps.Keys(files))
	for _, p := range paths {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			return "", fmt.Errorf("creating STATE tree: %w", err)
		}
		if err := os.WriteFile(full, files[p], 0o600); err != nil {
			return "", fmt.Errorf("creating STATE tree: %w", err)
		}
	}

	img := filepath.Join(dir, "state.img")
	if err := createSparse(img, stateSize); err != nil {
		return "", err
	}
	env := []string{"E2FSPROGS_FAKE_TIME=" + strconv.FormatInt(epoch, 10)}
	if _, _, err := mke2fs.run(ctx, env, "-q", "-t", "ext4", "-L", "STATE", "-U", id.String(),
		"-E", "root_owner=0:0,hash_seed="+hashSeed.String(), "-d", root, img); err != nil {
		return "", err
	}

	script := filepath.Join(dir, "state.debugfs")
	if err := os.WriteFile(script, []byte(stateMetadata(paths, epoch)), 0o600); err != nil {
		return "", fmt.Errorf("writing debugfs script: %w", err)
	}
	_, stderr, err := debugfs.run(ctx, env, "-w", "-f", script, img)
	if err != nil {
		return "", err
	}
	// debugfs exits 0 even when a command fails; its only other output on
	// standard error is the version banner.
	_, msgs, _ := bytes.Cut(stderr, []byte("\n"))
	if msgs = bytes.TrimSpace(msgs); len(msgs) > 0 {
		return "", fmt.Errorf("debugfs setting STATE metadata: %s", msgs)
	}
	return img, nil
}

// stateMetadata returns the debugfs commands that make root own every inode
// of the STATE tree holding paths, give directories mode 0700 (0755 for the
// root) and files 0600, and set all their times to epoch.
func stateMetadata(paths []string, epoch int64) string {
	modes := map[string]string{"/": "040755"}
	for _, p := range paths {
		modes["/"+p] = "0100600"
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			modes["/"+d] = "040700"
		}
	}
	t := "@" + strconv.FormatInt(epoch, 10)
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(modes)) {
		for _, field := range []string{"mode " + modes[p], "uid 0", "gid 0", "atime " + t, "mtime " + t, "ctime " + t} {
			fmt.Fprintf(&b, "set_inode_field %s %s\n", p, field)
		}
	}
	return b.String()
}
