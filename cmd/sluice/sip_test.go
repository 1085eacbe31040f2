package main

import (
	"flag"
	"io"
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
	fs := newFlagSet("t", io.Discard)
	o := addSIPFlags(fs)
	if err := parseFlags(fs, []string{"-sip-listen", "127.0.0.1:5080", "-sip-health-interval", "0"}, lookupIn(env)); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:5080" {
		t.Errorf("Listen %q: the flag must beat the environment", cfg.Listen)
	}
	if cfg.FailoverTimeout != 750*time.Millisecond {
		t.Errorf("FailoverTimeout %s, want 750ms from SLUICE_SIP_FAILOVER_TIMEOUT", cfg.FailoverTimeout)
	}
	if len(cfg.Backends) != 2 || cfg.Backends[1].Transport != "tcp" || cfg.Backends[0].Weight != 1 {
		t.Errorf("backends %+v", cfg.Backends)
	}
	if cfg.HealthInterval != 0 || cfg.Policy != "hash" {
		t.Errorf("health interval %s policy %q", cfg.HealthInterval, cfg.Policy)
	}
}

// TestSIPFlagErrors: a bad -sip-backend is refused at parse time, naming
// the flag.
func TestSIPFlagErrors(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"10.0.0.1", "address"},
		{"10.0.0.1:5060,transport=sctp", "transport must be udp or tcp"},
		{"10.0.0.1:5060,weight=0", "weight"},
		{"10.0.0.1:5060,metrics=ftp://x", "metrics must be an http(s) URL"},
		{"10.0.0.1:5060,color=blue", "unknown key"},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			var errs strings.Builder
			fs.SetOutput(&errs)
			addSIPFlags(fs)
			err := fs.Parse([]string{"-sip-backend", tc.arg})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "-sip-backend") {
				t.Errorf("error %v, want one naming -sip-backend and %q", err, tc.want)
			}
		})
	}
}
