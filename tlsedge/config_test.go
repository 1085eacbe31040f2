package tlsedge

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
)

func TestParseCertSpec(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    CertSpec
		wantErr string // substring; "" for none
	}{
		{in: "site.pem", want: CertSpec{Cert: "site.pem"}},
		{in: "/etc/ssl/site.pem,key=/etc/ssl/site.key", want: CertSpec{Cert: "/etc/ssl/site.pem", Key: "/etc/ssl/site.key"}},
		{in: " site.pem , key= site.key ", want: CertSpec{Cert: "site.pem", Key: "site.key"}},
		{in: "", wantErr: `"": no certificate file`},
		{in: ",key=a.key", wantErr: "no certificate file"},
		{in: "key=a.key", wantErr: "the certificate file comes first"},
		{in: "a.pem,key=", wantErr: "key= without a file"},
		{in: "a.pem,key=a,key=b", wantErr: "key= given twice"},
		{in: "a.pem,chain=c.pem", wantErr: `option "chain=c.pem" unknown`},
		{in: "a.pem,b.key", wantErr: `option "b.key" unknown`},
		{in: "a.pem,", wantErr: `option "" unknown`},
	} {
		got, err := ParseCertSpec(tc.in)
		if tc.wantErr == "" {
			if err != nil || got != tc.want {
				t.Errorf("ParseCertSpec(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
			if again, err := ParseCertSpec(got.String()); err != nil || again != got {
				t.Errorf("ParseCertSpec(%q.String()) = %+v, %v", tc.in, again, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "want CERTFILE[,key=KEYFILE]") {
			t.Errorf("ParseCertSpec(%q) error = %v; want one with %q and what is wanted", tc.in, err, tc.wantErr)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		field string // "" : valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"no bounds", func(c *Config) { c.HandshakesMax, c.HandshakeRate = 0, 0 }, ""},
		{"negative max", func(c *Config) { c.HandshakesMax = -1 }, "HandshakesMax"},
		{"negative rate", func(c *Config) { c.HandshakeRate = -5 }, "HandshakeRate"},
		{"NaN rate", func(c *Config) { c.HandshakeRate = math.NaN() }, "HandshakeRate"},
		{"infinite rate", func(c *Config) { c.HandshakeRate = math.Inf(1) }, "HandshakeRate"},
		{"zero timeout", func(c *Config) { c.HandshakeTimeout = 0 }, "HandshakeTimeout"},
		{"negative timeout", func(c *Config) { c.HandshakeTimeout = -time.Second }, "HandshakeTimeout"},
		{"bad spec", func(c *Config) { c.Certs = []string{"a.pem", "b.pem,k=1"} }, "Certs"},
	} {
		c := DefaultConfig()
		tc.edit(&c)
		err := c.Validate()
		var fe *admission.FieldError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.field != "" && !errors.As(err, &fe):
			t.Errorf("%s: error %v; want a FieldError of %s", tc.name, err, tc.field)
		case tc.field != "":
			if pkg, f := fe.ConfigField(); pkg != "tlsedge" || f != tc.field {
				t.Errorf("%s: field %s.%s; want tlsedge.%s", tc.name, pkg, f, tc.field)
			}
		}
	}
	if d := DefaultConfig(); d.HandshakesMax != 256 || d.HandshakeRate != 1000 || d.HandshakeTimeout != 10*time.Second {
		t.Errorf("DefaultConfig() = %+v", d)
	}
}
