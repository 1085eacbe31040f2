package node

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admin"
)

// syncBuffer is a bytes.Buffer safe for the node's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A reload that drops a run-time change logs it at WARN and /status
// shows it in last_reload; a reload that fails shows ok false and why;
// last_reload is absent before the first reload.
func TestReloadStatusAndDroppedWarn(t *testing.T) {
	cfg := testConfig(t)
	backends := twoBackends(t)
	cfg.BackendsFile = filepath.Join(t.TempDir(), "backends")
	write := func(lines ...string) {
		t.Helper()
		if err := os.WriteFile(cfg.BackendsFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("http "+backends[0], "http "+backends[1])
	cfg.AdminListen = "127.0.0.1:0"
	var logs syncBuffer
	n, err := New(cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop(time.Second) })
	adm := "http://" + n.Addrs().Admin.String()
	status := func() admin.Status {
		t.Helper()
		resp, err := http.Get(adm + "/status")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st admin.Status
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := status(); st.LastReload != nil {
		t.Errorf("before any reload: last_reload %+v, want absent", st.LastReload)
	}
	if code, body := post(t, adm+"/control/backends/b2/weight", "3"); code != 200 {
		t.Fatalf("weight: %d %s", code, body)
	}
	write("http "+backends[0], "http "+backends[1]+",weight=2")
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	st := status()
	if r := st.LastReload; r == nil || !r.OK || r.Error != "" || len(r.Dropped) != 1 || !strings.HasPrefix(r.Dropped[0], "backend/http/b2/weight=3 (by ") {
		t.Errorf("last_reload after a reload that dropped b2's weight: %+v", r)
	}
	var warned bool
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "backend/http/b2/weight") && strings.Contains(line, "dropped") {
			warned = strings.Contains(line, "level=WARN")
			if !warned {
				t.Errorf("dropped change logged as %q, want level=WARN", line)
			}
		}
	}
	if !warned {
		t.Errorf("no log line for the dropped change:\n%s", logs.String())
	}

	write("http nonsense,weight=x")
	if err := n.Reload(); err == nil {
		t.Fatal("a bad backends file reloaded")
	}
	if r := status().LastReload; r == nil || r.OK || !strings.Contains(r.Error, cfg.BackendsFile) || len(r.Dropped) != 0 {
		t.Errorf("last_reload after a failed reload: %+v", r)
	}
	write("http "+backends[0], "http "+backends[1]+",weight=2")
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	if r := status().LastReload; r == nil || !r.OK || len(r.Dropped) != 0 {
		t.Errorf("last_reload after a clean reload: %+v", r)
	}
}
