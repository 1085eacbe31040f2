package main

import (
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestSIPFlags: -sip-* flags and their SLUICE_* twins fill the Config; the
// command line wins over the environment.
func TestSIPFlags(t *testing.T) {
	env := map[string]string{
		"SLUICE_SIP_LISTEN":           "127.0.0.1:5999",
		"SLUICE_SIP_FAILOVER_TIMEOUT": "750ms",
		"SLUICE_SIP_BACKEND":          "10.0.0.1:5060 10.0.0.2:5060,transport=tcp",
	}
	fs := newFlagSet("sip", io.Discard)
	o := newRunFlags(fs)
	if err := parseFlags(fs, []string{"-sip-listen", "127.0.0.1:5080", "-sip-health-interval", "0"}, lookupIn(env)); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := o.config(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SIP.Listen != "127.0.0.1:5080" {
		t.Errorf("Listen %q: the flag must beat the environment", cfg.SIP.Listen)
	}
	if cfg.SIP.FailoverTimeout != 750*time.Millisecond {
		t.Errorf("FailoverTimeout %s, want 750ms from SLUICE_SIP_FAILOVER_TIMEOUT", cfg.SIP.FailoverTimeout)
	}
	if got := strings.Join(cfg.SIPBackends, " "); got != "10.0.0.1:5060 10.0.0.2:5060,transport=tcp" {
		t.Errorf("backends %q", got)
	}
	if cfg.SIP.HealthInterval != 0 || cfg.SIP.Policy != "hash" {
		t.Errorf("health interval %s policy %q", cfg.SIP.HealthInterval, cfg.SIP.Policy)
	}
}

// TestSIPFlagErrors: a bad -sip-backend is refused at parse time, naming
// the flag.
func TestSIPFlagErrors(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"10.0.0.1", "address"},
		{"10.0.0.1:5060,transport=sctp", "transport must be udp, tcp or tls"},
		{"10.0.0.1:5060,weight=0", "weight"},
		{"10.0.0.1:5060,metrics=ftp://x", "metrics must be an http(s) URL"},
		{"10.0.0.1:5060,color=blue", "unknown key"},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			var errs strings.Builder
			fs.SetOutput(&errs)
			newRunFlags(fs)
			err := fs.Parse([]string{"-sip-backend", tc.arg})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "-sip-backend") {
				t.Errorf("error %v, want one naming -sip-backend and %q", err, tc.want)
			}
		})
	}
}

// TestSIPIsRunPreset: `sluice sip` and `sluice run` given the same flags
// build the same node: the same affinity key file (a dialog's token stays
// valid when a deployment moves from one command to the other), the same
// shutdown drain, data directory and admin listener. The command lines
// are those of bench/sip.sh and the peers' harness.
func TestSIPIsRunPreset(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name      string
		args      []string
		keyFile   string
		drain     time.Duration
		adminAddr string
	}{
		{"defaults", []string{"-sip-backend", "127.0.0.1:5071"}, "", 10 * time.Second, "127.0.0.1:9090"},
		{"bench/sip.sh", []string{"-sip-listen", "127.0.0.1:5060", "-sip-backend", "127.0.0.1:5071", "-sip-backend", "127.0.0.1:5072",
			"-sip-health-interval", "0", "-sip-udp-buffer", "4194304", "-affinity-key-file", dir + "/affinity.key", "-log-level", "warn",
			"-cpuprofile", dir + "/cpu.prof", "-arm", "name=invites,proto=sip,method=INVITE,limit=300/s,action=reject"},
			dir + "/affinity.key", 10 * time.Second, "127.0.0.1:9090"},
		{"no drain", []string{"-sip-backend", "127.0.0.1:5071", "-drain-timeout", "0", "-admin-listen", ""}, "", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sip, _, _, code, ok := parseNode(sipPreset, tc.args, io.Discard)
			if !ok {
				t.Fatalf("sluice sip %v: exit %d", tc.args, code)
			}
			run, _, _, code, ok := parseNode(runPreset, tc.args, io.Discard)
			if !ok {
				t.Fatalf("sluice run %v: exit %d", tc.args, code)
			}
			if sip.Persist.Child == nil || run.Persist.Child == nil {
				t.Fatal("no store process (Persist.Child)")
			}
			sip.Persist.Child, run.Persist.Child = nil, nil // funcs never DeepEqual
			if !reflect.DeepEqual(sip, run) {
				t.Errorf("sluice sip and sluice run differ:\nsip %+v\nrun %+v", sip, run)
			}
			if sip.KeyFile != tc.keyFile || sip.DrainTimeout != tc.drain || sip.AdminListen != tc.adminAddr {
				t.Errorf("key file %q drain %s admin %q, want %q %s %q", sip.KeyFile, sip.DrainTimeout, sip.AdminListen, tc.keyFile, tc.drain, tc.adminAddr)
			}
			if sip.Persist.Dir != "./sluice-data" || len(sip.HTTPBackends) != 0 {
				t.Errorf("data dir %q, HTTP backends %v", sip.Persist.Dir, sip.HTTPBackends)
			}
		})
	}
}

// TestSIPNeedsBackend: `sluice sip` without a -sip-backend or a
// -backends-file stops at once, naming the flag.
func TestSIPNeedsBackend(t *testing.T) {
	var stderr strings.Builder
	_, _, _, code, ok := parseNode(sipPreset, []string{"-http-backend", "127.0.0.1:80"}, &stderr)
	if ok || code != 2 || !strings.Contains(stderr.String(), "sluice sip: -sip-backend: at least one is required") {
		t.Errorf("exit %d ok %v stderr %q, want 2 and -sip-backend named", code, ok, stderr.String())
	}
	if _, _, _, _, ok := parseNode(runPreset, []string{"-http-backend", "127.0.0.1:80"}, io.Discard); !ok {
		t.Error("sluice run refused an HTTP-only node")
	}
}

// TestRenamedFlag: -sip-drain-default, the former name of
// -sip-busy-default, still sets it from every source; the new name wins
// as any flag does over a later source, and GET /control/config writes
// the new name only.
func TestRenamedFlag(t *testing.T) {
	conf := writeFile(t, "sip-drain-default 7s\n")
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want time.Duration
	}{
		{"default", nil, nil, 5 * time.Second},
		{"old name", []string{"-sip-drain-default", "3s"}, nil, 3 * time.Second},
		{"new name", []string{"-sip-busy-default", "4s"}, nil, 4 * time.Second},
		{"old name in env", nil, map[string]string{"SLUICE_SIP_DRAIN_DEFAULT": "6s"}, 6 * time.Second},
		{"old name in file", []string{"-config", conf}, nil, 7 * time.Second},
		{"command line beats old name in env", []string{"-sip-busy-default", "2s"}, map[string]string{"SLUICE_SIP_DRAIN_DEFAULT": "6s"}, 2 * time.Second},
		{"env beats old name in file", []string{"-config", conf}, map[string]string{"SLUICE_SIP_BUSY_DEFAULT": "1s"}, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFlagSet("run", io.Discard)
			o := newRunFlags(fs)
			if err := parseFlags(fs, tc.args, lookupIn(tc.env)); err != nil {
				t.Fatal(err)
			}
			if o.sip.cfg.BusyDefault != tc.want {
				t.Errorf("BusyDefault %s, want %s", o.sip.cfg.BusyDefault, tc.want)
			}
			lines := strings.Join(settingLines(fs), "\n")
			if strings.Contains(lines, "sip-drain-default") || !strings.Contains(lines, "sip-busy-default "+tc.want.String()) {
				t.Errorf("settings %q: want sip-busy-default %s and no former name", lines, tc.want)
			}
		})
	}
}

// TestSIPEdgeFlags: the TLS, WS and WSS listener flags fill the Config
// (-sip-ws-origin repeatable); a bad origin or path is refused naming its
// flag.
func TestSIPEdgeFlags(t *testing.T) {
	fs := newFlagSet("sip", io.Discard)
	o := newRunFlags(fs)
	env := map[string]string{"SLUICE_SIP_WS_PATH": "/ws"}
	args := []string{"-sip-tls-listen", ":5061", "-sip-ws-listen", ":8080", "-sip-wss-listen", ":8443",
		"-tls-cert", "c.pem", "-tls-handshake-timeout", "3s",
		"-sip-ws-origin", "https://a.example", "-sip-ws-origin", "https://b.example:8443",
		"-sip-tls-advertise", "tls.example.com:5061", "-sip-wss-advertise", "edge.example.com:443"}
	if err := parseFlags(fs, args, lookupIn(env)); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := o.config(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.SIP
	if s.TLSListen != ":5061" || s.WSListen != ":8080" || s.WSSListen != ":8443" || s.WSPath != "/ws" ||
		s.TLSAdvertise != "tls.example.com:5061" || s.WSSAdvertise != "edge.example.com:443" || s.WSAdvertise != "" ||
		!reflect.DeepEqual(s.WSOrigins, []string{"https://a.example", "https://b.example:8443"}) ||
		!reflect.DeepEqual(cfg.TLS.Certs, []string{"c.pem"}) || cfg.TLS.HandshakeTimeout != 3*time.Second {
		t.Errorf("config %+v tls %+v", s, cfg.TLS)
	}
	for _, tc := range []struct{ flag, val string }{
		{"sip-ws-origin", "a.example"},
		{"sip-ws-origin", "https://a.example/path"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		newRunFlags(fs)
		if err := fs.Parse([]string{"-" + tc.flag, tc.val}); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("-%s %q: error %v, want one naming the flag", tc.flag, tc.val, err)
		}
	}
}
