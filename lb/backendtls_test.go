package lb

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBackendSpecTLSKeys(t *testing.T) {
	for _, tc := range []struct {
		proto, in string
		tls       bool
		ca, sni   string
		err       string // part of the error; "" for none
	}{
		{"http", "10.0.0.1:443,tls=on", true, "", "", ""},
		{"http", "10.0.0.1:443,tls=ON,sni=API.example.com", true, "", "api.example.com", ""},
		{"http", "10.0.0.1:443,tls=on,ca=/etc/ca.pem", true, "/etc/ca.pem", "", ""},
		{"http", "10.0.0.1:80,tls=off", false, "", "", ""},
		{"http", "10.0.0.1:443,tls=yes", false, "", "", `tls must be on or off (got "yes")`},
		{"http", "10.0.0.1:443,ca=/etc/ca.pem", false, "", "", "ca and sni need tls=on"},
		{"http", "10.0.0.1:443,tls=on,sni=bad_name", false, "", "", `sni "bad_name"`},
		{"http", "10.0.0.1:443,tls=on,ca=", false, "", "", "ca must name a PEM file"},
		{"sip", "10.0.0.1:5061,tls=on", false, "", "", `key "tls" is for HTTP backends`},
		{"sip", "10.0.0.1:5061,sni=x", false, "", "", "ca and sni need transport=tls"},
		{"sip", "10.0.0.1:5061,transport=tls,sni=Edge.example.com", false, "", "edge.example.com", ""},
	} {
		b, err := ParseBackendSpec(tc.proto, tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s %q: error %v, want one with %q", tc.proto, tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || b.TLS != tc.tls || b.CAFile != tc.ca || b.SNI != tc.sni {
			t.Errorf("%s %q: %+v, %v", tc.proto, tc.in, b, err)
			continue
		}
		back, err := ParseBackendSpec(tc.proto, b.String())
		if err != nil || back.TLS != b.TLS || back.CAFile != b.CAFile || back.SNI != b.SNI {
			t.Errorf("%q: %q does not parse back: %+v, %v", tc.in, b.String(), back, err)
		}
	}
}

func TestClientTLS(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.pem")
	os.WriteFile(empty, []byte("not a certificate\n"), 0o600)
	if cfg, err := (BackendSpec{ID: "a", Addr: "10.0.0.1:443"}).ClientTLS(); cfg != nil || err != nil {
		t.Fatalf("tls off: %v %v, want nil nil", cfg, err)
	}
	cfg, err := BackendSpec{ID: "a", Addr: "api.example.com:443", TLS: true}.ClientTLS()
	if err != nil || cfg.ServerName != "api.example.com" || cfg.InsecureSkipVerify || cfg.RootCAs != nil {
		t.Fatalf("system roots: %+v %v", cfg, err)
	}
	cfg, err = BackendSpec{ID: "a", Addr: "10.0.0.1:443", TLS: true, SNI: "api.internal"}.ClientTLS()
	if err != nil || cfg.ServerName != "api.internal" {
		t.Fatalf("sni: %v %v", cfg, err)
	}
	for _, ca := range []string{empty, filepath.Join(dir, "missing.pem")} {
		_, err = BackendSpec{ID: "a", Addr: "10.0.0.1:443", TLS: true, CAFile: ca}.ClientTLS()
		if err == nil || !strings.Contains(err.Error(), "ca="+ca) {
			t.Errorf("ca %s: error %v, want one naming ca=FILE", ca, err)
		}
	}
}

func TestGenerationBackendTLS(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	os.WriteFile(bad, []byte("no certificate here\n"), 0o600)
	g, err := NewGeneration(GenConfig{Proto: "http", Backends: []BackendSpec{
		{Addr: "10.0.0.1:443", TLS: true, SNI: "api.internal"},
		{Addr: "10.0.0.2:80"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	bs := g.Backends()
	if bs[0].TLS() == nil || bs[0].TLS().ServerName != "api.internal" || bs[1].TLS() != nil {
		t.Fatalf("backend TLS: %v, %v", bs[0].TLS(), bs[1].TLS())
	}
	_, err = NewGeneration(GenConfig{Proto: "http", Backends: []BackendSpec{{Addr: "10.0.0.1:443", TLS: true, CAFile: bad}}})
	if err == nil || !strings.Contains(err.Error(), "ca="+bad) {
		t.Fatalf("bad ca file: %v, want an error naming ca=%s", err, bad)
	}
}
