package persist

import (
	"os/exec"
	"syscall"
)

// setParentDeath has the kernel kill the store process when the balancer
// dies (PR_SET_PDEATHSIG), so that no store process outlives it holding
// the data directory; the child also exits on EOF of its socket.
func setParentDeath(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

func socketpair() ([2]int, error) {
	return syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
}
