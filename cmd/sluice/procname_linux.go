package main

import (
	"os"
	"strconv"
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

// yieldOnWake puts every thread of this process under SCHED_BATCH (threads
// started later inherit it from the one that starts them): a wake-up of
// the store process, which the balancer causes with every journal send,
// no longer preempts the balancer on a core they share; the store runs
// when the balancer waits, with the same fair share of the core as
// before. It reports how many threads it could not set.
func yieldOnWake() (failed int) {
	attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_BATCH}
	// Twice: a thread the runtime starts while the first pass lists them
	// is found by the second.
	for range 2 {
		failed = 0
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return 1
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if unix.SchedSetAttr(tid, &attr, 0) != nil {
				failed++
			}
		}
	}
	return failed
}
