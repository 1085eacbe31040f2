package main

import "syscall"

// childAttr makes the balancer die with this program: a driver killed
// mid-run leaves no sluice behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
