package boot

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/cairn-os/cairn/internal/layout"
	"os"
	"path/filepath"
	"strings"

	"github.com/u-root/u-root/pkg/kmodule"
	"golang.org/x/sys/unix"
)

// KernelRelease is the running kernel's release (uname -r).
func KernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// LoadModules loads every module of the list under /lib/modules/<release>,
// in order. Modules already loaded are skipped.
func LoadModules() error {
	dir := filepath.Join("/lib/modules", KernelRelease())
	f, err := os.Open(filepath.Join(dir, layout.ModuleList))
	if err != nil {
		return err
	}
	defer f.Close()
	var errs []error
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rel := strings.TrimSpace(sc.Text())
		if rel == "" {
			continue
		}
		if err := loadModule(filepath.Join(dir, rel)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, sc.Err())...)
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := kmodule.FileInit(f, "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load %s: %w", filepath.Base(path), err)
	}
	return nil
}
