package stage2

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/cairn-os/cairn/machineconfig"
)

// writeFiles writes machine.files under root ("/" on a node), each only
// if its content, mode or owner differ from the file there, and returns
// the paths it wrote. Each is written whole or not at all: a temporary
// file beside it, synced, renamed over it, and its directory synced. The
// writes are confined to the file's /etc or /var: a symlink there that
// leads out of it is refused. A file that cannot be written does not keep
// the others from being written; the error names each.
func writeFiles(root string, files []machineconfig.File) (written []string, err error) {
	var errs []error
	for i := range files {
		f := &files[i]
		switch ok, err := writeFile(root, f); {
		case err != nil:
			errs = append(errs, fmt.Errorf("write %s (machine.files[%d]): %w", f.Path, i, err))
		case ok:
			slog.Info("machine file written", "path", f.Path, "mode", fmt.Sprintf("%04o", uint32(f.Mode)), "owner", f.Owner, "bytes", len(f.Content))
			written = append(written, f.Path)
		}
	}
	return written, errors.Join(errs...)
}

// writeFile writes f under root unless it is there already, and reports
// whether it wrote it.
func writeFile(root string, f *machineconfig.File) (bool, error) {
	// f.Path is /etc/… or /var/… (validated): the top directory confines
	// what follows.
	top, rel, _ := strings.Cut(strings.TrimPrefix(f.Path, "/"), "/")
	r, err := os.OpenRoot(filepath.Join(root, top))
	if err != nil {
		return false, err
	}
	defer r.Close()
	mode := fs.FileMode(f.Mode).Perm()
	uid, gid := f.Ownership()
	if same, err := sameFile(r, rel, []byte(f.Content), mode, uid, gid); err != nil || same {
		return false, err
	}

	dir := path.Dir(rel)
	if err := r.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	tmp := path.Join(dir, "."+path.Base(rel)+".cairn-new")
	if err := r.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err // left by a write cut short
	}
	out, err := r.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return false, err
	}
	_, err = out.WriteString(f.Content)
	if err == nil {
		// fchmod, so that the umask does not narrow the mode.
		err = errors.Join(out.Chown(uid, gid), out.Chmod(mode))
	}
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = r.Rename(tmp, rel)
	}
	if err != nil {
		r.Remove(tmp)
		return false, err
	}
	return true, syncDir(r, dir)
}

// sameFile reports whether rel in r is a regular file with this content,
// mode and owner.
func sameFile(r *os.Root, rel string, content []byte, mode fs.FileMode, uid, gid int) (bool, error) {
	fi, err := r.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || !ok || fi.Mode().Perm() != mode || int(st.Uid) != uid || int(st.Gid) != gid || fi.Size() != int64(len(content)) {
		return false, nil
	}
	cur, err := r.ReadFile(rel)
	if err != nil {
		return false, err
	}
	return bytes.Equal(cur, content), nil
}

// syncDir makes a rename in dir durable.
func syncDir(r *os.Root, dir string) error {
	d, err := r.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// removeFiles removes the files at paths (machine.files dropped from the
// config) under root, confined to their /etc or /var as writeFiles is;
// one already gone is no error.
func removeFiles(root string, paths []string) error {
	var errs []error
	for _, p := range paths {
		top, rel, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
		r, err := os.OpenRoot(filepath.Join(root, top))
		if err == nil {
			err = r.Remove(rel)
			if err == nil {
				err = syncDir(r, path.Dir(rel))
			}
			r.Close()
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s (dropped from machine.files): %w", p, err))
			continue
		}
		slog.Info("machine file removed", "path", p)
	}
	return errors.Join(errs...)
}
