package sip

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// TestListenBusyNamesField: a listen address another socket holds stops
// Start with a FieldError naming the field that set it (cmd/sluice turns
// it into the flag: -sip-listen, -sip-tls-listen, ...), the address said
// once, and the cause kept for errors.Is.
func TestListenBusyNamesField(t *testing.T) {
	holder := startServer(t, serverOpts{backends: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9")}})
	busy := holder.Addr().String()
	srvTLS, _ := testTLS(t)
	for _, tc := range []struct {
		name  string
		mut   func(*Config)
		field string
	}{
		{"udp-and-tcp", func(c *Config) { c.Listen = busy }, "Listen"},
		{"tls", func(c *Config) { c.TLSListen = busy; c.TLSConfig = srvTLS }, "TLSListen"},
		{"ws", func(c *Config) { c.WSListen = busy }, "WSListen"},
		{"wss", func(c *Config) { c.WSSListen = busy; c.TLSConfig = srvTLS }, "WSSListen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := startErr(t, tc.mut)
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("error %v, want a FieldError of %s", err, tc.field)
			}
			if n := strings.Count(err.Error(), busy); n != 1 {
				t.Errorf("error %q names %s %d times, want once", err, busy, n)
			}
			if !strings.Contains(err.Error(), "address already in use") {
				t.Errorf("error %q does not give the cause", err)
			}
		})
	}
}

// startErr builds a server on a free loopback port, changed by mut, and
// returns what Start says (stopping it if it started).
func startErr(t *testing.T, mut func(*Config)) error {
	t.Helper()
	signer, err := lb.NewSigner(testKey)
	if err != nil {
		t.Fatal(err)
	}
	adm, err := admission.NewController(admission.ControllerConfig{}, nil, admission.MonoClock{}.Now())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: "127.0.0.1:0", Backends: []BackendConfig{{ID: "b1", Addr: "127.0.0.1:9", Transport: "udp", Weight: 1}}}
	mut(&cfg)
	s, err := New(cfg, Deps{Admission: adm, Signer: signer}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		return err
	}
	s.Close()
	t.Fatal("started on an address in use")
	return nil
}

// TestClientTLSCAErrors: a ca= file that cannot be used is named as the
// backend option that gave it (ca=PATH), with the cause, as HTTP's
// backends name theirs.
func TestClientTLSCAErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.der")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		ca, want string
	}{
		{missing, "ca=" + missing + ": open " + missing + ": no such file or directory"},
		{notPEM, "ca=" + notPEM + ": no PEM certificate in the file"},
	} {
		_, err := clientTLS(lb.BackendSpec{Addr: "127.0.0.1:5061", Transport: "tls", CAFile: tc.ca})
		if err == nil || err.Error() != tc.want {
			t.Errorf("ca=%s: error %v, want %q", tc.ca, err, tc.want)
		}
	}
}
