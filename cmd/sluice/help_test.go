package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestHelpTLSEdgeFlags: the flags of the HTTPS and SIP TLS edge are where
// an operator looks for them in `sluice run -help`, and say what they
// take: -https-listen and -https-redirect among the HTTP front end's
// flags (they sat under Operations), -http-backend's TLS options, and the
// TLS listeners pointing at -tls-cert.
func TestHelpTLSEdgeFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"run", "-help"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	s := out.String() + errb.String()
	section := func(title string) string {
		i := strings.Index(s, "\n"+title+":\n")
		if i < 0 {
			t.Fatalf("no section %q in:\n%s", title, s)
		}
		rest := s[i+len(title)+3:]
		if j := strings.Index(rest, "\n\n"); j >= 0 {
			rest = rest[:j]
		}
		return rest
	}
	for _, tc := range []struct {
		section, flag, want string
	}{
		{"HTTP front end", "-https-listen", "certificates by -tls-cert"},
		{"HTTP front end", "-https-redirect", "443"},
		{"HTTP front end", "-http-backend", "tls=on[,ca=FILE][,sni=NAME]"},
		{"SIP front end", "-sip-tls-listen", "certificates by -tls-cert"},
		{"SIP front end", "-sip-wss-listen", "certificates by -tls-cert"},
		{"TLS (certificates and handshakes of every TLS listener)", "-tls-cert", "Ed25519"},
	} {
		sec := section(tc.section)
		i := strings.Index(sec, "  "+tc.flag+" ")
		if i < 0 {
			i = strings.Index(sec, "  "+tc.flag+"\n") // a bool flag
		}
		if i < 0 {
			t.Errorf("%s is not in section %q", tc.flag, tc.section)
			continue
		}
		entry := sec[i+2:]
		if j := strings.Index(entry, "\n  -"); j >= 0 {
			entry = entry[:j]
		}
		if !strings.Contains(entry, tc.want) {
			t.Errorf("%s help lacks %q: %s", tc.flag, tc.want, entry)
		}
	}
	if strings.Contains(section("Operations"), "-https-") {
		t.Errorf("an -https- flag is still under Operations")
	}
}
