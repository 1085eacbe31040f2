package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

func statusBackends(t *testing.T, admin string) []string {
	t.Helper()
	_, _, body := httpGet(t, "http://"+admin+"/status")
	var st struct {
		Backends []struct {
			ID     string `json:"id"`
			Weight int    `json:"weight"`
		} `json:"backends"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/status: %v", err)
	}
	var ids []string
	for _, b := range st.Backends {
		ids = append(ids, fmt.Sprintf("%s/%d", b.ID, b.Weight))
	}
	sort.Strings(ids)
	return ids
}

// TestSIGHUPReloadsBackends: SIGHUP re-reads -backends-file; the backend
// that stays keeps its sticky clients, the removed one gets no new work,
// the added one does; a bad file changes nothing.
func TestSIGHUPReloadsBackends(t *testing.T) {
	var addrs = map[string]string{}
	for _, name := range []string{"b1", "b2", "b3"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, name) }))
		defer srv.Close()
		addrs[name] = srv.Listener.Addr().String()
	}
	file := filepath.Join(t.TempDir(), "backends")
	write := func(lines ...string) {
		if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("# two backends", "http "+addrs["b1"]+",id=b1", "http "+addrs["b2"]+",id=b2", "sip 127.0.0.1:5999,id=s1")
	cmd, got := startSluiceAddrs(t, "-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(),
		"-backends-file", file, "-health-interval", "0", "-sip-listen", "127.0.0.1:0", "-sip-health-interval", "0")
	front, admin := "http://"+got["http"], got["admin"]
	if ids := statusBackends(t, admin); strings.Join(ids, " ") != "b1/1 b2/1 s1/1" {
		t.Fatalf("backends at start: %v", ids)
	}
	// Find a client pinned to b1.
	var cookie string
	for range 4 {
		_, hdr, body := httpGet(t, front+"/")
		if body == "b1" {
			cookie = strings.SplitN(hdr.Get("Set-Cookie"), ";", 2)[0]
			break
		}
	}
	if cookie == "" {
		t.Fatal("no request went to b1")
	}

	write("http "+addrs["b1"]+",id=b1,weight=3", "http "+addrs["b3"]+",id=b3", "sip 127.0.0.1:5999,id=s1", "sip 127.0.0.1:5998,id=s2,weight=2")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the reload", func() bool {
		return strings.Join(statusBackends(t, admin), " ") == "b1/3 b3/1 s1/1 s2/2"
	})
	for i := range 10 {
		if code, _, body := httpGet(t, front+"/", "Cookie", cookie); code != 200 || body != "b1" {
			t.Fatalf("sticky request %d after reload: %d %q", i, code, body)
		}
	}
	seen := map[string]int{}
	for range 16 {
		_, _, body := httpGet(t, front+"/")
		seen[body]++
	}
	if seen["b2"] != 0 || seen["b1"] == 0 || seen["b3"] == 0 {
		t.Errorf("new work after reload: %v, want b1 and b3 only", seen)
	}

	write("http nohost,id=x")
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the failed reload in the event log", func() bool {
		_, _, ev := httpGet(t, "http://"+admin+"/events?limit=50")
		return strings.Contains(ev, "backends not reloaded") && strings.Contains(ev, "nohost")
	})
	if ids := statusBackends(t, admin); strings.Join(ids, " ") != "b1/3 b3/1 s1/1 s2/2" {
		t.Errorf("a bad file changed the backends: %v", ids)
	}
}
