// Package opfile reads the files an operator names (-config, -arm-file,
// -backends-file, -admin-token-file, sluice ctl -token-file) and the files
// of a data directory that read-only tools open: regular files only, at
// most a few MiB, without hanging on a FIFO. It imports only the standard
// library, so every package of sluice may use it.
package opfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// MaxSize is the most an operator file may hold: far more than any
// configuration, far less than would hurt the process.
const MaxSize = 4 << 20

// Errors of Read, ReadLines and OpenRegular (wrapped, with the file's name).
var (
	// ErrNotRegular: a FIFO, a device, a directory or a socket.
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge: the file holds more than the limit.
	ErrTooLarge = errors.New("file too large")
	// ErrHalfWritten: the last line has no newline.
	ErrHalfWritten = errors.New("last line has no newline: the file looks half-written")
	// ErrSymlink: OpenRegular with NoFollow met a symbolic link.
	ErrSymlink = errors.New("is a symbolic link")
)

// Options of OpenRegular.
type Options struct {
	// NoFollow refuses a symbolic link as the last element of the path
	// (O_NOFOLLOW): for files inside a directory sluice owns, never for
	// operator files (a Kubernetes ConfigMap is a link).
	NoFollow bool
}

// OpenRegular opens path for reading and makes sure it is a regular file
// (after following it, unless o.NoFollow): it is opened non-blocking, so a
// FIFO cannot hang the open, then checked with fstat on the descriptor
// itself, so nothing can swap the file between the check and the read.
func OpenRegular(path string, o Options) (*os.File, os.FileInfo, error) {
	flags := os.O_RDONLY | oNonblock
	if o.NoFollow {
		if err := checkNoLink(path); err != nil {
			return nil, nil, err
		}
		flags |= oNofollow
	}
	f, err := os.OpenFile(path, flags, 0)
	if err != nil {
		if o.NoFollow && errors.Is(err, syscall.ELOOP) {
			return nil, nil, fmt.Errorf("%s %w: refused", path, ErrSymlink)
		}
		return nil, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w (%s)", path, ErrNotRegular, kind(st.Mode()))
	}
	return f, st, nil
}

// kind names a file type for an error.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "type " + m.Type().String()
}

// ReadAll reads what f holds, at most max bytes; more is ErrTooLarge.
func ReadAll(f *os.File, name string, max int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s: %w: more than %s, the most read", name, ErrTooLarge, Size(max))
	}
	return data, nil
}

// Read returns the content of the regular file at path (a link is
// followed), at most max bytes (MaxSize when max <= 0). Errors name path;
// the caller puts the flag in front.
func Read(path string, max int64) ([]byte, error) {
	if max <= 0 {
		max = MaxSize
	}
	f, st, err := OpenRegular(path, Options{})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st.Size() > max {
		return nil, fmt.Errorf("%s: %w: %s, more than %s, the most read", path, ErrTooLarge, Size(st.Size()), Size(max))
	}
	return ReadAll(f, path, max)
}

// ReadLines is Read for a file of lines that is re-read while sluice runs
// (-backends-file, -arm-file): a file that does not end with a newline is
// refused, as one caught while being written. An empty file is fine.
func ReadLines(path string, max int64) ([]byte, error) {
	data, err := Read(path, max)
	if err != nil {
		return nil, err
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		return nil, fmt.Errorf("%s: %w; write the new file elsewhere and rename it into place (mv is atomic)", path, ErrHalfWritten)
	}
	return data, nil
}

// Size prints a byte count in the largest whole binary unit.
func Size(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
