package main

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/node"
)

// TestDNSFlags: names in -http-backend and -sip-backend and the -dns-*
// flags land in the node's Config; a bad name is refused when the flag is
// read, naming the flag and what is wanted.
func TestDNSFlags(t *testing.T) {
	fs := newFlagSet("run", io.Discard)
	o := newRunFlags(fs)
	args := []string{"-http-backend", "dns:app.internal:8080,pool=web", "-sip-backend", "srv:carrier.example,transport=udp",
		"-sip-backend", "naptr:carrier.example", "-dns-server", "10.0.0.2:5353", "-dns-min-ttl", "2s", "-dns-max-ttl", "1m",
		"-dns-keep-stale", "10m", "-dns-drain", "30s", "-dns-timeout", "1s", "-dns-family", "ipv4"}
	if err := parseFlags(fs, args, lookupIn(nil)); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := o.config(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := node.DNSConfig{Server: "10.0.0.2:5353", MinTTL: 2 * time.Second, MaxTTL: time.Minute, KeepStale: 10 * time.Minute, Drain: 30 * time.Second, Timeout: time.Second, Family: "ipv4"}
	if cfg.DNS != want {
		t.Errorf("DNS config %+v, want %+v", cfg.DNS, want)
	}
	if !slices.Equal(cfg.HTTPBackends, []string{"dns:app.internal:8080,pool=web"}) || len(cfg.SIPBackends) != 2 {
		t.Errorf("backends %q %q", cfg.HTTPBackends, cfg.SIPBackends)
	}
	if d := node.DefaultDNSConfig(); d.MinTTL != 5*time.Second || d.MaxTTL != 5*time.Minute || d.KeepStale != time.Hour || d.Drain != time.Minute {
		t.Errorf("defaults %+v", d)
	}
	// A 0 was read as the default: -dns-keep-stale 0 kept a failed name's
	// addresses for an hour. It is refused, naming the flag and the default.
	for _, c := range []struct{ flag, want string }{
		{"-dns-min-ttl", "-dns-min-ttl 0: want a duration above 0, such as 1s (without the flag: 5s)"},
		{"-dns-max-ttl", "-dns-max-ttl 0: want a duration above 0, such as 1s (without the flag: 5m0s)"},
		{"-dns-keep-stale", "-dns-keep-stale 0: want a duration above 0, such as 1s (without the flag: 1h0m0s)"},
		{"-dns-drain", "-dns-drain 0: want a duration above 0, such as 1s (without the flag: 1m0s)"},
		{"-dns-timeout", "-dns-timeout 0: want a duration above 0, such as 1s (without the flag: 2s)"},
	} {
		fs := newFlagSet("run", io.Discard)
		o := newRunFlags(fs)
		if err := parseFlags(fs, []string{"-http-backend", "dns:app.internal:8080", c.flag, "0s"}, lookupIn(nil)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := o.config(io.Discard); err == nil || err.Error() != c.want {
			t.Errorf("%s 0s: %v, want %q", c.flag, err, c.want)
		}
	}
	for _, c := range []struct{ flag, value, want string }{
		{"-http-backend", "dns:app.internal", "want dns:HOST:PORT"},
		{"-http-backend", "naptr:carrier.example", "naptr: is for SIP backends"},
		{"-sip-backend", "srv:carrier.example,weight=3", "comes from their SRV records"},
		{"-http-backend", "dns:app:80,id=a", "a DNS name gives several"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		newRunFlags(fs)
		err := fs.Parse([]string{c.flag, c.value})
		if err == nil || !strings.Contains(err.Error(), c.flag) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: %v, want an error naming the flag with %q", c.flag, c.value, err, c.want)
		}
	}
}
