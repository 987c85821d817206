package volumes

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The layout of a volume whose files the node writes, the one readers of
// Kubernetes volumes expect:
//
//	dir/..2026_01_02_15_04_05.123456  the files, in a timestamped directory
//	dir/..data -> ..2026_01_02_15_04_05.123456
//	dir/token -> ..data/token         one link per top-level name
//
// A new version is written to a new timestamped directory and ..data is
// swapped to it with rename(2), so that a reader that follows the links
// sees the whole old version or the whole new one, never a mix or half a
// file. The version before stays until the next write: a reader that
// resolved ..data to it just before the swap still finds its files. Names
// starting with ".." are the writer's own.
const (
	dataLink    = "..data"
	dataLinkTmp = "..data_tmp"
)

// file is one file of a volume.
type file struct {
	data []byte
	mode fs.FileMode
}

// writeAtomic makes dir hold exactly files, by relative path, and reports
// whether it wrote: it leaves dir as it is when it holds them already.
func writeAtomic(dir string, files map[string]file) (bool, error) {
	tops, err := checkPaths(files)
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	old, err := os.Readlink(filepath.Join(dir, dataLink))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		old = ""
	case err != nil:
		return false, err
	default:
		if same, err := holds(filepath.Join(dir, old), files); err != nil || same {
			return false, err
		}
	}

	ts, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return false, err
	}
	if err := writeFiles(ts, files); err != nil {
		return false, errors.Join(err, os.RemoveAll(ts))
	}
	tmp := filepath.Join(dir, dataLinkTmp)
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return false, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, dataLink)); err != nil {
		return false, err
	}
	return true, tidy(dir, filepath.Base(ts), old, tops)
}

// checkPaths rejects paths that would leave the volume, name the writer's
// own entries or make a file of a directory, and returns the top-level
// names.
func checkPaths(files map[string]file) (map[string]bool, error) {
	tops := map[string]bool{}
	for p := range files {
		if !filepath.IsLocal(p) || filepath.Clean(p) != p {
			return nil, fmt.Errorf("path %q: not a clean relative path inside the volume", p)
		}
		top, _, _ := strings.Cut(p, string(filepath.Separator))
		if strings.HasPrefix(top, "..") {
			return nil, fmt.Errorf("path %q: names starting with .. are reserved", p)
		}
		tops[top] = true
		for d := filepath.Dir(p); d != "."; d = filepath.Dir(d) {
			if _, ok := files[d]; ok {
				return nil, fmt.Errorf("path %q: %q is a file", p, d)
			}
		}
	}
	return tops, nil
}

// holds reports whether dir holds exactly files, with their modes.
func holds(dir string, files map[string]file) (bool, error) {
	n := 0
	same := true
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		f, ok := files[rel]
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !ok || !info.Mode().IsRegular() || info.Mode().Perm() != f.mode || info.Size() != int64(len(f.data)) {
			same = false
			return filepath.SkipAll
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !bytes.Equal(data, f.data) {
			same = false
			return filepath.SkipAll
		}
		n++
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil // ..data dangles: write anew
	}
	return same && n == len(files), err
}

// writeFiles writes files under dir with their modes, whatever the umask.
func writeFiles(dir string, files map[string]file) error {
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	for p, f := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, f.data, f.mode); err != nil {
			return err
		}
		if err := os.Chmod(full, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// tidy links each top-level name into ..data and removes what the
// version in ts no longer has: links of names gone, timestamped
// directories older than prev, the version before.
func tidy(dir, ts, prev string, tops map[string]bool) error {
	for top := range tops {
		link := filepath.Join(dir, top)
		target := filepath.Join(dataLink, top)
		if got, err := os.Readlink(link); err == nil && got == target {
			continue
		}
		if err := os.RemoveAll(link); err != nil {
			return err
		}
		if err := os.Symlink(target, link); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if name == dataLink || name == ts || name == prev || tops[name] {
			continue
		}
		errs = append(errs, os.RemoveAll(filepath.Join(dir, name)))
	}
	return errors.Join(errs...)
}
