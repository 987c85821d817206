// Package need is how a test says what it needs from the host: root, a
// tool from a Debian package, cgroup v2, a binary that make builds. When
// something is missing the test is skipped with the reason, so that
// `go test ./...` stays useful on a laptop; with CAIRN_NO_SKIP set (make
// test and CI set it) the test fails instead, naming what to install, so a
// green run can never hide proof that did not run.
package need

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// EnvNoSkip, when non-empty, turns every missing prerequisite into a
// failure.
const EnvNoSkip = "CAIRN_NO_SKIP"

// Missing skips tb with the reason, or fails it when EnvNoSkip is set.
func Missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(EnvNoSkip) != "" {
		tb.Fatalf("%s (failing, not skipping, because %s is set)", msg, EnvNoSkip)
	}
	tb.Skip(msg)
}

// Root needs the test to run as root; why says what for.
func Root(tb testing.TB, why string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Missing(tb, "needs root: %s", why)
	}
}

// Tool needs the program name on the PATH, from the Debian package pkg
// (hack/deps.sh installs it), and returns its path.
func Tool(tb testing.TB, name, pkg string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Missing(tb, "needs %s: install the Debian package %s (hack/deps.sh)", name, pkg)
	}
	return path
}

// File needs the file at path, from the Debian package pkg.
func File(tb testing.TB, path, pkg string) {
	tb.Helper()
	if _, err := os.Stat(path); err != nil {
		Missing(tb, "needs %s: install the Debian package %s (hack/deps.sh)", path, pkg)
	}
}

// Built needs the file at path that `make target` builds.
func Built(tb testing.TB, path, target, env string) {
	tb.Helper()
	if _, err := os.Stat(path); err != nil {
		Missing(tb, "no %s: run make %s (or set %s)", path, target, env)
	}
}

// CgroupV2 returns where cgroup v2 is mounted: /sys/fs/cgroup on a node,
// /sys/fs/cgroup/unified on a hybrid (v1) host.
func CgroupV2(tb testing.TB) string {
	tb.Helper()
	for _, dir := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return dir
		}
	}
	Missing(tb, "needs cgroup v2 at /sys/fs/cgroup or /sys/fs/cgroup/unified")
	return ""
}
