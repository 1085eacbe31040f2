//go:build unix

package persist

import (
	"errors"
	"os"
	"syscall"
)

// lockDir takes the same flock badger takes on dir (exclusive, or shared
// for a read-only open) without blocking, so that a directory held by a
// running sluice is reported as ErrLocked before anything is touched. The
// returned function releases it.
func lockDir(dir string, shared bool) (release func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_EX | syscall.LOCK_NB
	if shared {
		how = syscall.LOCK_SH | syscall.LOCK_NB
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, err
	}
	return func() { f.Close() }, nil
}
