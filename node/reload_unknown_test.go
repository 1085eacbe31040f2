package node

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/lb"
)

// TestBackendsReloadNewBackendUnknown: a backend a reload adds starts
// unknown, and its first probe decides. One that refuses connections was
// up after the reload (one failed probe of a fall of 3) and got new work.
func TestBackendsReloadNewBackendUnknown(t *testing.T) {
	cfg := testConfig(t)
	cfg.Health.Interval = time.Hour // the probe before the new set serves, then none in the test's time
	cfg.Health.Fall = 3
	backends := twoBackends(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close() // nothing listens there: connections are refused
	cfg.BackendsFile = filepath.Join(t.TempDir(), "backends")
	write := func(lines ...string) {
		t.Helper()
		if err := os.WriteFile(cfg.BackendsFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("http " + backends[0])
	cfg.AdminListen = "127.0.0.1:0"
	n, front, _ := controlNode(t, cfg)
	write("http "+backends[0], "http "+gone+",id=new")
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	nb := n.httpSrv.Pool().Lookup("new")
	if nb == nil {
		t.Fatal("no backend new after the reload")
	}
	if s := nb.State(n.clock.Now()); s != lb.Down {
		t.Errorf("new backend that refuses connections: %v after its first probe, want down", s)
	}
	for i := range 6 {
		if code, body, _ := get(t, front+"/", ""); code != 200 || body != "b1" {
			t.Fatalf("request %d after the reload: %d %q", i, code, body)
		}
	}
	if r := nb.Status(n.clock.Now()).Requests; r != 0 {
		t.Errorf("%d requests sent to the new backend nobody has seen answer, want 0", r)
	}
}
