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

// TestSIGHUPReloadsARMFile: SIGHUP re-reads -arm-file in a real process;
// an unchanged rule keeps its counters, a changed limit takes effect, a
// bad file changes nothing and its error (file and line) is in the event
// log.
func TestSIGHUPReloadsARMFile(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer be.Close()
	file := filepath.Join(t.TempDir(), "arm.rules")
	write := func(lines ...string) {
		if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("# rules", "name=api,proto=http,path=/api/,limit=2/min,action=reject", "name=other,proto=http,path=/other/,limit=5/min,action=reject")
	cmd, got := startSluiceAddrs(t, "-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(),
		"-http-backend", be.Listener.Addr().String()+",id=b1", "-health-interval", "0", "-arm-file", file)
	front, admin := "http://"+got["http"], "http://"+got["admin"]
	codes := func(path string, n int) string {
		var s []string
		for range n {
			code, _, _ := httpGet(t, front+path)
			s = append(s, fmt.Sprint(code))
		}
		return strings.Join(s, " ")
	}
	if c := codes("/api/x", 3); c != "200 200 429" {
		t.Fatalf("api at 2/min: %s", c)
	}
	codes("/other/x", 1)
	config := func() string { _, _, body := httpGet(t, admin+"/control/config"); return body }

	write("name=api,proto=http,path=/api/,limit=4/min,action=reject", "name=other,proto=http,path=/other/,limit=5/min,action=reject")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the rules to reload", func() bool { return strings.Contains(config(), "limit=4/min") })
	// The metered rate of api (2) is kept: two more fit under 4.
	if c := codes("/api/x", 3); c != "200 200 429" {
		t.Errorf("api after raising to 4/min: %s", c)
	}
	_, _, status := httpGet(t, admin+"/status")
	if !strings.Contains(status, `"name": "other",
      "rate": 1`) {
		t.Errorf("the unchanged rule lost its count:\n%s", status)
	}

	write("name=api,proto=http,path=/api/,limit=4/min,action=reject", "name=broken,limit=lots")
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the failed reload in the event log", func() bool {
		_, _, ev := httpGet(t, admin+"/events?limit=50")
		return strings.Contains(ev, "arm rules not reloaded") && strings.Contains(ev, "arm.rules:2:")
	})
	if cfg := config(); !strings.Contains(cfg, "name=other") || strings.Contains(cfg, "broken") {
		t.Errorf("a bad file changed the rules:\n%s", cfg)
	}
}
