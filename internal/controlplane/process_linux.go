package controlplane

import "syscall"

// sysProcAttr puts each binary in its own process group and has the kernel
// kill it if the test binary dies without cleaning up.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// Alive reports whether a process with this pid exists; a pid that we have
// reaped does not.
func Alive(pid int) bool {
	return pid > 0 && syscall.Kill(pid, 0) != syscall.ESRCH
}
