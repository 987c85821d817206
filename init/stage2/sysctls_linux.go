package stage2

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cairn-os/cairn/machineconfig"
)

// procSys is where the kernel's parameters are.
const procSys = "/proc/sys"

// applySysctls sets machine.sysctls under dir (procSys), in the order of
// their names, each only if the kernel's value differs, and returns the
// names it set with the values they had. A parameter that cannot be set (this kernel has none by
// that name, or refuses the value) does not keep the others from being
// set; the error names each.
func applySysctls(dir string, sysctls map[string]string) (was map[string]string, err error) {
	names := make([]string, 0, len(sysctls))
	for name := range sysctls {
		names = append(names, name)
	}
	slices.Sort(names)
	var errs []error
	was = map[string]string{}
	for _, name := range names {
		want := sysctls[name]
		path := filepath.Join(dir, machineconfig.SysctlPath(name))
		cur, err := os.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			errs = append(errs, fmt.Errorf("sysctl %s (machine.sysctls): this kernel has no %s", name, path))
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("sysctl %s (machine.sysctls): %w", name, err))
			continue
		case sameSysctl(string(cur), want):
			continue
		}
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("sysctl %s = %q (machine.sysctls): %w", name, want, err))
			continue
		}
		slog.Info("sysctl set", "name", name, "value", want, "was", strings.TrimSpace(string(cur)))
		was[name] = strings.TrimSpace(string(cur))
	}
	return was, errors.Join(errs...)
}

// sameSysctl reports whether the kernel's value cur is want: the kernel
// separates the numbers of a vector with tabs, where a config may use
// spaces.
func sameSysctl(cur, want string) bool {
	return slices.Equal(strings.Fields(cur), strings.Fields(want))
}
