//go:build unix

package sip

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// startGroup starts cmd (Kamailio) in a process group of its own and, when
// the test ends, stops the group it made: SIGTERM, and SIGKILL if it has not
// exited 10 s later. Stopping only the first process is not enough: Kamailio
// forks workers, and one that outlives it (seen: main and a worker both
// stuck in a futex during Kamailio's own SIGTERM handling, SIGTERM blocked)
// keeps its output pipe open, so cmd.Wait, waiting for that output, never
// returned and the package's test binary hung until its 15-minute timeout.
// WaitDelay bounds that wait too. The returned channel closes when it has
// exited.
func startGroup(t *testing.T, cmd *exec.Cmd) <-chan struct{} {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	pgid := cmd.Process.Pid // Setpgid: the group is numbered by its first process
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Logf("%s did not stop on SIGTERM within 10s; killing its process group", cmd.Path)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-exited
		}
		// Workers that outlived the first process are in the group still.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	})
	return exited
}
