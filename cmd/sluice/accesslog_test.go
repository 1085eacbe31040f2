package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSIGUSR1ReopensAccessLog: what logrotate does (rename, then kill
// -USR1): the line before the signal stays in the renamed file, the one
// after goes to a new file at the flag's path.
func TestSIGUSR1ReopensAccessLog(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer be.Close()
	logf := filepath.Join(t.TempDir(), "access.log")
	cmd, got := startSluiceAddrs(t, "-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(),
		"-http-backend", be.Listener.Addr().String()+",id=b1", "-health-interval", "0", "-access-log", logf, "-access-log-format", "logfmt")
	front := "http://" + got["http"]
	read := func(p string) string { b, _ := os.ReadFile(p); return string(b) }
	httpGet(t, front+"/before")
	waitFor(t, 10*time.Second, "the first line", func() bool { return strings.Contains(read(logf), "path=/before") })
	if err := os.Rename(logf, logf+".1"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the reopened file", func() bool { _, err := os.Stat(logf); return err == nil })
	httpGet(t, front+"/after")
	waitFor(t, 10*time.Second, "the line after the signal", func() bool { return strings.Contains(read(logf), "path=/after") })
	if old, cur := read(logf+".1"), read(logf); strings.Count(old, "\n") != 1 || strings.Count(cur, "\n") != 1 || strings.Contains(cur, "/before") {
		t.Errorf("rotated file %q, new file %q: want one line each", old, cur)
	}
}
