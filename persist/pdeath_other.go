//go:build !linux

package persist

import (
	"errors"
	"os"
	"os/exec"
)

// parentDeathSignal: none without PR_SET_PDEATHSIG.
var parentDeathSignal os.Signal

// setParentDeath: without PR_SET_PDEATHSIG the store process ends on EOF
// of its socket when the balancer dies.
func setParentDeath(cmd *exec.Cmd) {}

var errNoChild = errors.New("the store process needs Linux")

func socketpair() ([2]int, error) { return [2]int{}, errNoChild }

func journalPair() ([2]int, error) { return [2]int{}, errNoChild }

func sendJournal(fd int, msg []byte) error { return errNoChild }

func closeFD(fd int) {}

func readFD(fd int, p []byte) (int, bool, error) { return 0, false, errNoChild }

func pollable(f *os.File) (*os.File, error) { return nil, errNoChild }

func orphanStoreProcess(db string) int { return 0 }

func killPID(pid int) error { return errNoChild }
