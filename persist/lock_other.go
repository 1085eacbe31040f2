//go:build !unix

package persist

// lockDir is a no-op where flock is not available; badger.Open still
// refuses a directory in use, with its own error.
func lockDir(dir string, shared bool) (release func(), err error) {
	return func() {}, nil
}
