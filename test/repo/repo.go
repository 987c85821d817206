// Package repo finds the Cairn repository from a test, so that tests can
// build its programs and find what `make` put in _out.
package repo

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Root returns the main module's directory: up from the working directory
// (a test's package directory), else from this file's.
func Root() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	for _, d := range starts {
		for ; ; d = filepath.Dir(d) {
			if isRoot(d) {
				return d, nil
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return "", errors.New("cannot find the cairn repository (go.mod of github.com/cairn-os/cairn)")
}

func isRoot(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) == 2 && f[0] == "module" {
			return f[1] == "github.com/cairn-os/cairn"
		}
	}
	return false
}
