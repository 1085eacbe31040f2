package tlsedge

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzParseCertSpec: any value is parsed or refused naming what is
// wanted, never a panic; what parses prints back to itself.
func FuzzParseCertSpec(f *testing.F) {
	for _, s := range []string{"a.pem", "a.pem,key=b.key", ",", "key=x", "a,key=b,key=c", "a,\x00=b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := ParseCertSpec(s)
		if err != nil {
			if !strings.Contains(err.Error(), "want CERTFILE[,key=KEYFILE]") {
				t.Fatalf("%q: %v says not what is wanted", s, err)
			}
			return
		}
		if again, err := ParseCertSpec(spec.String()); err != nil || again != spec {
			t.Fatalf("%q: %+v prints as %q, which parses as %+v, %v", s, spec, spec.String(), again, err)
		}
	})
}

// FuzzLoadCert: any file content is loaded or refused with an error
// naming the file, never a panic.
func FuzzLoadCert(f *testing.F) {
	k := testKey(f, "ecdsa", 0)
	good := append(certPEM(makeCert(f, certOpts{dns: []string{"a.example"}, key: k})), keyPEM(f, k, "sec1")...)
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "c.pem")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := loadCert(CertSpec{Cert: p}, time.Now()); err != nil && !strings.Contains(err.Error(), p) {
			t.Fatalf("error %v names no file", err)
		}
	})
}
