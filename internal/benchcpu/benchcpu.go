// Package benchcpu measures a benchmark's cost as process CPU time rather
// than wall time: on a shared machine the wall clock also counts the time
// other processes held the cores. bench/curves.sh draws what it reports.
package benchcpu

import (
	"syscall"
	"testing"
	"time"
)

// Now is the CPU time the process has used, user and system; 0 when it
// cannot be read.
func Now() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Report reports the process CPU time per operation since start over n
// operations as cpu-ns/op.
func Report(b *testing.B, start time.Duration, n int) {
	if n > 0 && start > 0 {
		b.ReportMetric(float64(Now()-start)/float64(n), "cpu-ns/op")
	}
}
