package rootfs

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// ResolveModules returns the modules named by names, with all their
// dependencies, as paths relative to modulesDir (<root>/lib/modules/<release>)
// in load order: every module comes after its dependencies and appears once.
//
// A name matches a module file's base name without its .ko, .ko.xz or
// .ko.zst suffix, with '-' and '_' treated as equal. Names of modules that
// are built into the kernel (listed in modules.builtin) are skipped.
func ResolveModules(modulesDir string, names []string) ([]string, error) {
	deps, byName, err := readModulesDep(filepath.Join(modulesDir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	builtin, err := readModulesBuiltin(filepath.Join(modulesDir, "modules.builtin"))
	if err != nil {
		return nil, err
	}

	var order []string
	state := map[string]int{} // 1: visiting, 2: done
	var visit func(mod string) error
	visit = func(mod string) error {
		switch state[mod] {
		case 1:
			return fmt.Errorf("module dependency cycle through %s", mod)
		case 2:
			return nil
		}
		state[mod] = 1
		for _, dep := range deps[mod] {
			if err := visit(dep); err != nil {
				return err
			}
		}
		state[mod] = 2
		order = append(order, mod)
		return nil
	}
	for _, name := range names {
		mod, ok := byName[moduleName(name)]
		if !ok {
			if builtin[moduleName(name)] {
				continue
			}
			return nil, fmt.Errorf("module %q not found in %s", name, modulesDir)
		}
		if err := visit(mod); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// readModulesDep parses modules.dep into each module's dependencies
// (sorted, so the result does not depend on depmod's ordering) and an index
// from module name to path.
func readModulesDep(file string) (deps map[string][]string, byName map[string]string, err error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, fmt.Errorf("read module dependencies: %w", err)
	}
	defer f.Close()
	deps = map[string][]string{}
	byName = map[string]string{}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			return nil, nil, fmt.Errorf("%s:%d: missing ':'", file, line)
		}
		name := moduleName(path.Base(mod))
		if other, dup := byName[name]; dup {
			return nil, nil, fmt.Errorf("%s:%d: module %s is both %s and %s", file, line, name, other, mod)
		}
		byName[name] = mod
		deps[mod] = strings.Fields(rest)
		slices.Sort(deps[mod])
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", file, err)
	}
	return deps, byName, nil
}

// readModulesBuiltin returns the names listed in modules.builtin; a kernel
// without that file has no built-in modules to report.
func readModulesBuiltin(file string) (map[string]bool, error) {
	data, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read built-in modules: %w", err)
	}
	builtin := map[string]bool{}
	for _, mod := range strings.Fields(string(data)) {
		builtin[moduleName(path.Base(mod))] = true
	}
	return builtin, nil
}

// moduleName normalizes a module name or file name: no .ko suffix and
// '_' instead of '-'.
func moduleName(s string) string {
	for _, ext := range []string{".ko.xz", ".ko.zst", ".ko"} {
		if trimmed, ok := strings.CutSuffix(s, ext); ok {
			s = trimmed
			break
		}
	}
	return strings.ReplaceAll(s, "-", "_")
}
