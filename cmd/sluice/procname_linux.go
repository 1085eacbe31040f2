package main

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// setProcessName sets the name top, pgrep and /proc/PID/comm show for
// this process (at most 15 bytes are kept): started as /proc/self/exe,
// the store process would otherwise be called "exe".
func setProcessName(name string) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return
	}
	_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(p)), 0, 0, 0)
}
