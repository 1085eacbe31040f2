package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNodeAccessLog: a node with -access-log FILE logs each request as a
// JSON line, reopens the file after a rename (what SIGUSR1 does), and
// shows the log's counters in /metrics and /status.
func TestNodeAccessLog(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, r.Header.Get("X-Request-ID")) }))
	defer be.Close()
	path := filepath.Join(t.TempDir(), "access.log")
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{be.Listener.Addr().String() + ",id=b1"}
	cfg.AdminListen = "127.0.0.1:0"
	cfg.HTTP.RequestID = true
	cfg.AccessLog = DefaultAccessLogConfig()
	cfg.AccessLog.Dest = path
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	a := n.Addrs()
	get := func(url string) string {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	rid := get("http://" + a.HTTP.String() + "/one")
	lines := func(p string) []string {
		b, _ := os.ReadFile(p)
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	waitFor(t, 5*time.Second, "the first line", func() bool { return strings.Contains(lines(path)[0], `"path":"/one"`) })
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines(path)[0]), &rec); err != nil || rec["request_id"] != rid || rec["backend"] != "b1" || rec["status"] != 200.0 {
		t.Errorf("line %v (%v): want request_id %q, backend b1, status 200", rec, err, rid)
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	n.ReopenAccessLog()
	waitFor(t, 5*time.Second, "the file reopened", func() bool { _, err := os.Stat(path); return err == nil })
	get("http://" + a.HTTP.String() + "/two")
	waitFor(t, 5*time.Second, "the second line", func() bool { return strings.Contains(lines(path)[0], `"path":"/two"`) })
	if l := lines(path + ".1"); len(l) != 1 {
		t.Errorf("the rotated file has %d lines, want 1", len(l))
	}
	m := get("http://" + a.Admin.String() + "/metrics")
	for _, want := range []string{`sluice_access_log_dropped_total{proto="http"} 0`, `sluice_access_log_written_total{proto="http"} 2`, `sluice_access_log_lost_total{proto="http"} 0`, `sluice_access_log_lost_total{proto="sip"} 0`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	var st struct {
		AccessLog struct {
			HTTP struct {
				Logged, Written uint64
				Lost            *uint64
			}
		} `json:"access_log"`
	}
	if err := json.Unmarshal([]byte(get("http://"+a.Admin.String()+"/status")), &st); err != nil || st.AccessLog.HTTP.Logged != 2 || st.AccessLog.HTTP.Lost == nil || *st.AccessLog.HTTP.Lost != 0 {
		t.Errorf("/status access_log %+v %v: want 2 logged", st.AccessLog, err)
	}
}

func TestNodeAccessLogErrors(t *testing.T) {
	for _, tc := range []struct {
		set  func(*AccessLogConfig)
		want string
	}{
		{func(c *AccessLogConfig) { c.Format = "xml" }, "-access-log-format"},
		{func(c *AccessLogConfig) { c.Sample = "new=2" }, "-access-log-sample"},
		{func(c *AccessLogConfig) { c.Dest = "syslog+unix://x" }, "-access-log"},
		{func(c *AccessLogConfig) { c.Dest = "-"; c.SIPDest = "/proc/no/such/dir/x" }, "-sip-access-log"},
		{func(c *AccessLogConfig) { c.Dest = "syslog+tcp://127.0.0.1:514?facilty=local3" }, `-access-log "syslog+tcp://127.0.0.1:514?facilty=local3": query parameter "facilty"`},
	} {
		cfg := testConfig(t)
		cfg.HTTPBackends = []string{"127.0.0.1:1,id=b1"}
		cfg.AccessLog = DefaultAccessLogConfig()
		tc.set(&cfg.AccessLog)
		if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", cfg.AccessLog, err, tc.want)
		}
	}
}

// TestNodeAccessLogSyslogDownAtStart: a syslog receiver that refuses
// connections when sluice starts does not stop it (the lines are counted
// lost until the receiver answers).
func TestNodeAccessLogSyslogDownAtStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{"127.0.0.1:1,id=b1"}
	cfg.AccessLog = DefaultAccessLogConfig()
	cfg.AccessLog.Dest = "syslog+tcp://" + addr
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("New with the syslog receiver down: %v", err)
	}
	if n.AccessLog() == nil {
		t.Error("no access log")
	}
	n.closeAccessLog()
}
