package opfile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// inTime runs f and fails the test if it has not returned after a
// generous bound: what is tested is that it returns at all (a FIFO used
// to block the open for ever), not how fast.
func inTime(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not return: it blocks", what)
	}
}

func TestReadRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	zeroLink := filepath.Join(dir, "zero.conf")
	if err := os.Symlink("/dev/zero", zeroLink); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/dev/zero", zeroLink, fifo, dir} {
		var err error
		inTime(t, "Read("+path+")", func() { _, err = Read(path, MaxSize) })
		if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), path) {
			t.Errorf("Read(%s) = %v, want ErrNotRegular naming the file", path, err)
		}
		inTime(t, "ReadLines("+path+")", func() { _, err = ReadLines(path, MaxSize) })
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadLines(%s) = %v, want ErrNotRegular", path, err)
		}
	}
}

func TestReadBounded(t *testing.T) {
	dir := t.TempDir()
	exact := filepath.Join(dir, "exact")
	over := filepath.Join(dir, "over")
	os.WriteFile(exact, bytes.Repeat([]byte("a\n"), MaxSize/2), 0o600)
	os.WriteFile(over, bytes.Repeat([]byte("a"), MaxSize+1), 0o600)
	if data, err := Read(exact, MaxSize); err != nil || len(data) != MaxSize {
		t.Errorf("Read of exactly %d bytes: %d bytes, %v", MaxSize, len(data), err)
	}
	_, err := Read(over, MaxSize)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "4 MiB") {
		t.Errorf("Read of %d bytes = %v, want ErrTooLarge naming 4 MiB", MaxSize+1, err)
	}
	// A file that grows past its stat size is still cut at the limit.
	f, err := os.Open(over)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := ReadAll(f, over, 10); !errors.Is(err, ErrTooLarge) {
		t.Errorf("ReadAll past the limit = %v, want ErrTooLarge", err)
	}
}

func TestReadLinesRefusesHalfWrittenFile(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		content string
		ok      bool
	}{
		{"", true},
		{"sip 127.0.0.1:2857\n", true},
		{"# only a comment\n\n", true},
		{"sip 127.0.0.1:2857", false},
		{"http 127.0.0.1:1\nsip 127.0.0.1:28", false},
	} {
		p := filepath.Join(dir, "backends")
		os.WriteFile(p, []byte(c.content), 0o600)
		data, err := ReadLines(p, MaxSize)
		switch {
		case c.ok && (err != nil || string(data) != c.content):
			t.Errorf("ReadLines(%q) = %q, %v; want it as written", c.content, data, err)
		case !c.ok && (!errors.Is(err, ErrHalfWritten) || !strings.Contains(err.Error(), "rename")):
			t.Errorf("ReadLines(%q) = %v, want ErrHalfWritten telling to rename", c.content, err)
		}
		if _, err := Read(p, MaxSize); err != nil {
			t.Errorf("Read(%q) = %v: only ReadLines asks for a final newline", c.content, err)
		}
	}
}

func TestOpenRegularNoFollow(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	os.WriteFile(real, []byte("x\n"), 0o600)
	link := filepath.Join(dir, "link")
	os.Symlink(real, link)
	if data, err := Read(link, MaxSize); err != nil || string(data) != "x\n" {
		t.Errorf("Read through a link to a regular file = %q, %v; operator files may be links", data, err)
	}
	if _, _, err := OpenRegular(link, Options{NoFollow: true}); !errors.Is(err, ErrSymlink) {
		t.Errorf("OpenRegular(link, NoFollow) = %v, want ErrSymlink", err)
	}
	f, _, err := OpenRegular(real, Options{NoFollow: true})
	if err != nil {
		t.Fatalf("OpenRegular(regular, NoFollow) = %v", err)
	}
	f.Close()
}
