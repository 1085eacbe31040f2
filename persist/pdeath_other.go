//go:build !linux

package persist

import (
	"errors"
	"os/exec"
)

// setParentDeath: without PR_SET_PDEATHSIG the store process ends on EOF
// of its socket when the balancer dies.
func setParentDeath(cmd *exec.Cmd) {}

func socketpair() ([2]int, error) {
	return [2]int{}, errors.New("the store process needs Linux")
}
