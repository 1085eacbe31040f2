package tlsedge

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestLoadKeyFormats loads ECDSA P-256 and RSA 2048 keys in PKCS#1,
// PKCS#8 and SEC 1, beside the certificate and in a key file.
func TestLoadKeyFormats(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		kind, format, keyType string
		sameFile              bool
	}{
		{"ecdsa", "sec1", "ECDSA P-256", false},
		{"ecdsa", "pkcs8", "ECDSA P-256", false},
		{"ecdsa", "sec1", "ECDSA P-256", true},
		{"rsa", "pkcs1", "RSA 2048", false},
		{"rsa", "pkcs8", "RSA 2048", false},
		{"rsa", "pkcs1", "RSA 2048", true},
	} {
		name := tc.kind + "-" + tc.format
		k := testKey(t, tc.kind, 0)
		der := makeCert(t, certOpts{dns: []string{"a.example"}, key: k})
		spec := CertSpec{Cert: writeFile(t, dir, name+".pem", certPEM(der))}
		if tc.sameFile {
			spec.Cert = writeFile(t, dir, name+"-both.pem", append(keyPEM(t, k, tc.format), certPEM(der)...)) // key first: order is free
		} else {
			spec.Key = writeFile(t, dir, name+".key", keyPEM(t, k, tc.format))
		}
		e, err := loadCert(spec, time.Now())
		if err != nil {
			t.Errorf("%s (same file %v): %v", name, tc.sameFile, err)
			continue
		}
		if e.keyType != tc.keyType || !slices.Equal(e.names, []string{"a.example"}) || e.cert.Leaf == nil {
			t.Errorf("%s: key type %q names %v leaf %v", name, e.keyType, e.names, e.cert.Leaf != nil)
		}
	}
}

// TestLoadRefuses: every bad file is refused with an error naming it and
// saying what is wrong.
func TestLoadRefuses(t *testing.T) {
	dir := t.TempDir()
	ec0, ec1 := testKey(t, "ecdsa", 0), testKey(t, "ecdsa", 1)
	good := makeCert(t, certOpts{dns: []string{"a.example"}, key: ec0})
	goodPEM := certPEM(good)
	key0 := keyPEM(t, ec0, "pkcs8")
	encrypted := pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1, 2, 3}})
	legacyEnc := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-128-CBC,00"}, Bytes: []byte{1}})
	small := testKey(t, "rsa1024", 0)
	caDER := theCA(t).cert.Raw
	for _, tc := range []struct {
		name    string
		cert    []byte // nil: the file does not exist
		key     []byte // nil: no key file
		is      error  // errors.Is; nil: check text only
		text    string
		culprit string // the file the error must name: "cert" or "key"
	}{
		{name: "missing file", cert: nil, text: "no such file", culprit: "cert"},
		{name: "not PEM", cert: good, text: "no PEM block", culprit: "cert"},
		{name: "no certificate", cert: key0, is: ErrNoCert, culprit: "cert"},
		{name: "no key", cert: goodPEM, is: ErrNoKey, text: "key=KEYFILE", culprit: "cert"},
		{name: "empty key file", cert: goodPEM, key: []byte("# nothing\n"), text: "no PEM block", culprit: "key"},
		{name: "key file without key", cert: goodPEM, key: goodPEM, is: ErrNoKey, culprit: "key"},
		{name: "wrong key", cert: goodPEM, key: keyPEM(t, ec1, "sec1"), is: ErrKeyMismatch, culprit: "key"},
		{name: "wrong key same file", cert: append(slices.Clone(goodPEM), keyPEM(t, ec1, "pkcs8")...), is: ErrKeyMismatch, culprit: "cert"},
		{name: "two keys", cert: goodPEM, key: append(slices.Clone(key0), keyPEM(t, ec1, "pkcs8")...), text: "2 private keys; want one", culprit: "key"},
		{name: "encrypted key", cert: goodPEM, key: encrypted, is: ErrEncryptedKey, culprit: "key"},
		{name: "legacy encrypted key", cert: goodPEM, key: legacyEnc, is: ErrEncryptedKey, culprit: "key"},
		{name: "garbage key", cert: goodPEM, key: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("junk")}), text: "not a PKCS#1, PKCS#8 or SEC 1 key", culprit: "key"},
		{name: "RSA 1024", cert: certPEM(makeCert(t, certOpts{dns: []string{"a.example"}, key: small})), key: keyPEM(t, small, "pkcs1"), is: ErrKeyType, text: "1024 bits; want at least 2048", culprit: "key"},
		{name: "expired", cert: certPEM(makeCert(t, certOpts{dns: []string{"a.example"}, notBefore: time.Now().Add(-48 * time.Hour), notAfter: time.Now().Add(-time.Hour)})), key: key0, is: ErrExpired, culprit: "cert"},
		{name: "not yet valid", cert: certPEM(makeCert(t, certOpts{dns: []string{"a.example"}, notBefore: time.Now().Add(time.Hour)})), key: key0, is: ErrNotYetValid, culprit: "cert"},
		{name: "no names", cert: certPEM(makeCert(t, certOpts{})), key: key0, is: ErrNoNames, culprit: "cert"},
		{name: "client certificate", cert: certPEM(makeCert(t, certOpts{dns: []string{"a.example"}, eku: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})), key: key0, is: ErrNotServerAuth, culprit: "cert"},
		{name: "chain out of order", cert: certPEM(caDER, good), key: key0, is: ErrChainOrder, culprit: "cert"},
		{name: "chain in order", cert: certPEM(good, caDER), key: key0, culprit: "none"},
		{name: "foreign certificate after the leaf", cert: certPEM(good, makeCert(t, certOpts{dns: []string{"b.example"}})), key: key0, is: ErrChainOrder, culprit: "cert"},
		{name: "corrupt certificate", cert: certPEM([]byte("junk")), key: key0, text: "certificate 1 of the file", culprit: "cert"},
	} {
		spec := CertSpec{Cert: dir + "/" + strings.ReplaceAll(tc.name, " ", "-") + ".pem"}
		if tc.cert != nil {
			writeFile(t, dir, strings.ReplaceAll(tc.name, " ", "-")+".pem", tc.cert)
		}
		if tc.key != nil {
			spec.Key = writeFile(t, dir, strings.ReplaceAll(tc.name, " ", "-")+".key", tc.key)
		}
		_, err := loadCert(spec, time.Now())
		if tc.culprit == "none" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: loaded", tc.name)
			continue
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: %v; want %v", tc.name, err, tc.is)
		}
		if tc.text != "" && !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: %v; want %q in it", tc.name, err, tc.text)
		}
		file := spec.Cert
		if tc.culprit == "key" {
			file = spec.Key
		}
		if !strings.Contains(err.Error(), file) {
			t.Errorf("%s: %v does not name %s", tc.name, err, file)
		}
	}
}

func TestLoadRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	_, err := loadCert(CertSpec{Cert: dir}, time.Now())
	if err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a directory: %v", err)
	}
	big := make([]byte, maxPEM+1)
	p := writeFile(t, dir, "big.pem", big)
	if _, err := loadCert(CertSpec{Cert: p}, time.Now()); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("a huge file: %v", err)
	}
	os.Remove(p)
}

func TestCertNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    certOpts
		want []string
	}{
		{"SAN DNS, case and dot", certOpts{dns: []string{"WWW.Example.COM.", "*.example.com", "www.example.com"}, cn: "ignored.example"}, []string{"www.example.com", "*.example.com"}},
		{"SAN IP", certOpts{ips: []net.IP{net.ParseIP("192.0.2.7"), net.ParseIP("2001:db8::1")}, cn: "ignored.example"}, []string{"192.0.2.7", "2001:db8::1"}},
		{"CN only without SAN", certOpts{cn: "Legacy.Example"}, []string{"legacy.example"}},
		{"none", certOpts{}, nil},
	} {
		leaf, err := x509.ParseCertificate(makeCert(t, tc.o))
		if err != nil {
			t.Fatal(err)
		}
		if got := certNames(leaf); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v; want %v", tc.name, got, tc.want)
		}
	}
}
