//go:build !linux

package kube

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }

func alive(pid int) bool { return false }
