//go:build !linux

package controlplane

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }

func Alive(pid int) bool { return false }
