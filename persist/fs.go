package persist

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/sluicelb/sluice/internal/opfile"
)

// fileSystem is the part of the operating system the store writes
// through. Production uses osFS; tests inject one that fails or hangs, to
// show that a disk that errs or stops answering never takes the balancer
// down. No file is memory-mapped: a write to a full or vanished
// filesystem is an error returned by write(2), never a SIGBUS.
type fileSystem interface {
	OpenFile(name string, flag int, perm os.FileMode) (writeFile, error)
	ReadFile(name string) ([]byte, error)
	ReadDir(name string) ([]os.DirEntry, error)
	Stat(name string) (os.FileInfo, error)
	Rename(from, to string) error
	Remove(name string) error
	// SyncDir makes the directory entries of dir durable (after a rename).
	SyncDir(dir string) error
}

// writeFile is an open file the store writes to.
type writeFile interface {
	Write(p []byte) (int, error)
	Sync() error
	Close() error
}

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (writeFile, error) {
	return os.OpenFile(name, flag, perm)
}
func (osFS) ReadFile(name string) ([]byte, error)       { return readStoreFile(name) }
func (osFS) ReadDir(name string) ([]os.DirEntry, error) { return os.ReadDir(name) }
func (osFS) Stat(name string) (os.FileInfo, error)      { return os.Stat(name) }
func (osFS) Rename(from, to string) error               { return os.Rename(from, to) }
func (osFS) Remove(name string) error                   { return os.Remove(name) }
func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// storeFileMax bounds a read of one file of the store: a segment is
// closed at segmentMax (1 MiB), the other files hold a few records per
// backend and rule.
const storeFileMax = 64 << 20

// readStoreFile reads a file of the data directory: a regular file, not
// followed if it is a symbolic link, opened without waiting on a FIFO, at
// most storeFileMax bytes. A link or FIFO planted in the directory, or a
// huge file, is an error, never a hang or unbounded memory.
func readStoreFile(name string) ([]byte, error) {
	f, st, err := opfile.OpenRegular(name, opfile.Options{NoFollow: true})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st.Size() > storeFileMax {
		return nil, fmt.Errorf("%s: %w: %s, more than %s", name, opfile.ErrTooLarge, opfile.Size(st.Size()), opfile.Size(storeFileMax))
	}
	return opfile.ReadAll(f, name, storeFileMax)
}

// tmpSuffix marks a file being written by writeAtomic; one left by a crash
// is removed at the next open.
const tmpSuffix = ".tmp"

// writeAtomic replaces dir/name with data: it writes name.tmp, syncs it,
// renames it over name and syncs the directory, so that after a crash or
// power loss the file holds either the old or the new content, whole.
// On failure the old file is untouched and the temporary one removed.
func writeAtomic(fsys fileSystem, dir, name string, data []byte) error {
	path := filepath.Join(dir, name)
	tmp := path + tmpSuffix
	f, err := fsys.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fsys.Rename(tmp, path)
	}
	if err != nil {
		if rerr := fsys.Remove(tmp); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
		return err
	}
	return fsys.SyncDir(dir)
}

// writeSmallFile writes one of the directory's small files (the learned
// rates, the overrides, the cluster's node count) atomically, one writer
// at a time, and records the outcome in the store's health under what.
// The error names the store and wraps ErrUnwritable.
func (s *Store) writeSmallFile(name, what string, data []byte) error {
	s.mopWrite.Lock()
	err := s.ensureFormat()
	if err == nil {
		err = writeAtomic(s.fs, s.dir, name, data)
	}
	s.mopWrite.Unlock()
	if err != nil {
		s.fault(what, err)
		return fmt.Errorf("save %s to %s: %w: %w", what, s.cfg.Dir, ErrUnwritable, err)
	}
	s.ok(what)
	return nil
}
