package node

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicelb/sluice/internal/opfile"
)

func TestReadBackendsFileErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ body, want string }{
		{"ftp 127.0.0.1:1\n", ":1: protocol \"ftp\""},
		{"http\n", ":1: want"},
		{"# c\nhttp nohost\n", ":2:"},
		// A duplicate id is named with both lines, not "new pool: duplicate backend id".
		{"http 127.0.0.1:1,id=a\nsip 127.0.0.1:2,id=a\nhttp 127.0.0.1:3,id=a\n", `:3: http backend id "a" already on line 1`},
		{"sip 127.0.0.1:5060\nsip 127.0.0.1:5060,weight=2\n", `:2: sip backend id "127.0.0.1:5060" already on line 1`},
	} {
		f := filepath.Join(dir, "b")
		os.WriteFile(f, []byte(tc.body), 0o600)
		if _, err := readBackendsFile(f); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "-backends-file") {
			t.Errorf("%q: err %v, want one with %q", tc.body, err, tc.want)
		}
	}
	if _, err := readBackendsFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file accepted")
	}
}

// TestOperatorFilesBounded: -backends-file and -arm-file are read only
// when they are regular files, whole (ending with a newline) and at most
// opfile.MaxSize; a file caught half-written on SIGHUP changes nothing.
func TestOperatorFilesBounded(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	os.WriteFile(big, []byte(strings.Repeat("# padding\n", opfile.MaxSize/10+1)), 0o600)
	half := filepath.Join(dir, "half")
	os.WriteFile(half, []byte("http 127.0.0.1:1\nsip 127.0.0.1:2857"), 0o600)
	for _, c := range []struct{ path, want string }{
		{half, "half-written; write the new file elsewhere and rename it into place"},
		{big, "more than 4 MiB"},
		{fifo, "not a regular file"}, // (/dev/zero is opfile's test: without the bound it eats memory)
	} {
		done := make(chan error, 1)
		go func() { _, err := readBackendsFile(c.path); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "-backends-file") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("-backends-file %s: err %v, want one naming the flag with %q", c.path, err, c.want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("-backends-file %s: the read does not return", c.path)
		}
	}

	// SIGHUP with a half-written -arm-file: the rules in force stay.
	cfg := testConfig(t)
	cfg.HTTPBackends = twoBackends(t)[:1]
	cfg.AdminListen = "127.0.0.1:0"
	cfg.ARMFile = filepath.Join(t.TempDir(), "arm.rules")
	os.WriteFile(cfg.ARMFile, []byte("name=api,proto=http,limit=2/min,action=reject\n"), 0o600)
	n, _, _ := controlNode(t, cfg)
	os.WriteFile(cfg.ARMFile, []byte("name=api,proto=http,limit=2/min,action=reject\nname=more,path=/m/,limit=3/s"), 0o600) // cut before ",action=reject\n"
	if err := n.ReloadARM(); err == nil || !strings.Contains(err.Error(), "-arm-file") || !strings.Contains(err.Error(), "half-written") {
		t.Errorf("reload of a half-written -arm-file: %v, want an error naming the flag and saying half-written", err)
	}
	if rs := n.ctrl.RuleConfigs(); len(rs) != 1 || rs[0].Name != "api" {
		t.Errorf("rules after a refused reload: %v, want api alone", rs)
	}
}

// TestAffinityKeyFileBounded: -affinity-key-file is read like the other
// operator files: a FIFO stops start-up at once, naming the flag.
func TestAffinityKeyFileBounded(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{"127.0.0.1:1"}
	cfg.KeyFile = filepath.Join(t.TempDir(), "keys")
	if err := syscall.Mkfifo(cfg.KeyFile, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		n, err := New(cfg, nil)
		if err == nil {
			n.Stop(time.Second)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "affinity") || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("-affinity-key-file a FIFO: %v, want an error naming the key file, not a regular file", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("-affinity-key-file a FIFO: start-up does not return")
	}
}

// TestExampleBackendsFile: examples/backends reads and its pools and
// routes name pools of its backends.
func TestExampleBackendsFile(t *testing.T) {
	f, err := readBackendsFile(filepath.Join("..", "examples", "backends"))
	if err != nil {
		t.Fatal(err)
	}
	for proto, set := range map[string]specSet{"http": f.http, "sip": f.sip} {
		if err := f.check(proto, set); err != nil {
			t.Errorf("%s: %v", proto, err)
		}
		if len(set.Routes) == 0 {
			t.Errorf("%s: no routes in the example", proto)
		}
	}
}

// TestReadBackendsFilePoolsAndRoutes: pool and route lines, in order, and
// their errors naming the file and line.
func TestReadBackendsFilePoolsAndRoutes(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "b")
	os.WriteFile(f, []byte("http 127.0.0.1:1,pool=api\nhttp-route pool=api,host=b.example\nhttp-route pool=api,host=a.example\nhttp-pool name=api,policy=p2c\nsip 127.0.0.1:2\nsip-route pool=default,method=REGISTER\n"), 0o600)
	got, err := readBackendsFile(f)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got.http.Routes, " ") != "pool=api,host=b.example pool=api,host=a.example" || len(got.http.Pools) != 1 || len(got.sip.Routes) != 1 || len(got.sip.Backends) != 1 {
		t.Errorf("read %+v", got)
	}
	for _, tc := range []struct{ body, want string }{
		{"http-route pool=api,colour=red\n", `:1: http-route "pool=api,colour=red": route "pool=api,colour=red": unknown key "colour"`},
		{"# c\nsip-pool name=x,hash-key=source\n", `:2: sip-pool "name=x,hash-key=source"`},
		{"http-routes pool=a\n", `:1: "http-routes": want http, sip, http-pool, sip-pool, http-route or sip-route`},
		{"http-route\n", `:1: want "http SPEC"`},
	} {
		os.WriteFile(f, []byte(tc.body), 0o600)
		if _, err := readBackendsFile(f); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want %q", tc.body, err, tc.want)
		}
	}
}
