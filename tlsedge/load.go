package tlsedge

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/sluicelb/sluice/internal/opfile"
)

// maxPEM is the most a certificate or key file may hold: a chain is a
// few KiB; more is not a certificate file.
const maxPEM = 1 << 20

// minRSABits is the smallest RSA key accepted.
const minRSABits = 2048

// Errors of loading a certificate, wrapped with the file's name and the
// details; errors.Is tells them apart.
var (
	ErrNotPEM        = errors.New("no PEM block (want a PEM file: -----BEGIN CERTIFICATE----- ...; DER is not read)")
	ErrNoCert        = errors.New("no CERTIFICATE block")
	ErrNoKey         = errors.New("no private key")
	ErrKeyMismatch   = errors.New("private key does not match the certificate's public key")
	ErrExpired       = errors.New("certificate expired")
	ErrNotYetValid   = errors.New("certificate not yet valid")
	ErrNoNames       = errors.New("certificate names no host: no DNS or IP subject alternative name and no common name")
	ErrKeyType       = errors.New("unsupported private key")
	ErrEncryptedKey  = errors.New("encrypted private key: not supported; write it unencrypted (openssl pkey -in KEY -out KEY.plain) with mode 0600")
	ErrChainOrder    = errors.New("chain out of order: each certificate must be followed by its issuer's, the leaf first")
	ErrNotServerAuth = errors.New("certificate not for server authentication (its extended key usage lacks serverAuth)")
)

// entry is one certificate in service: parsed once at load.
type entry struct {
	spec        CertSpec
	cert        *tls.Certificate
	names       []string // lower case, no trailing dot; "*.example.com" for a wildcard
	fingerprint [32]byte // SHA-256 of the leaf
	keyType     string
	loadedAt    time.Time
}

// pemParts are the blocks of a PEM file sluice reads.
type pemParts struct {
	certs [][]byte // DER, in file order
	keys  []*pem.Block
}

// readPEM reads file (bounded, regular files only) and sorts its blocks.
// Blocks of other types (DH or EC parameters) are skipped.
func readPEM(file string) (pemParts, error) {
	var out pemParts
	data, err := opfile.Read(file, maxPEM)
	if err != nil {
		return out, err
	}
	rest, blocks := data, 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		blocks++
		switch {
		case b.Type == "CERTIFICATE":
			out.certs = append(out.certs, b.Bytes)
		case b.Type == "ENCRYPTED PRIVATE KEY" || strings.HasSuffix(b.Type, "PRIVATE KEY") && b.Headers["Proc-Type"] != "":
			return out, ErrEncryptedKey
		case b.Type == "PRIVATE KEY" || b.Type == "RSA PRIVATE KEY" || b.Type == "EC PRIVATE KEY":
			out.keys = append(out.keys, b)
		}
	}
	if blocks == 0 {
		return out, ErrNotPEM
	}
	return out, nil
}

// parseKey parses a PKCS#1, PKCS#8 or SEC 1 private key, whatever its
// label says first, and checks its type and size.
func parseKey(b *pem.Block) (crypto.Signer, string, error) {
	var key any
	var err error
	tries := []func([]byte) (any, error){
		func(d []byte) (any, error) { return x509.ParsePKCS8PrivateKey(d) },
		func(d []byte) (any, error) { return x509.ParsePKCS1PrivateKey(d) },
		func(d []byte) (any, error) { return x509.ParseECPrivateKey(d) },
	}
	switch b.Type {
	case "RSA PRIVATE KEY":
		tries[0], tries[1] = tries[1], tries[0]
	case "EC PRIVATE KEY":
		tries[0], tries[2] = tries[2], tries[0]
	}
	for _, try := range tries {
		if key, err = try(b.Bytes); err == nil {
			break
		}
	}
	if err != nil {
		return nil, "", fmt.Errorf("%s block: not a PKCS#1, PKCS#8 or SEC 1 key: %w", b.Type, err)
	}
	switch k := key.(type) {
	case *rsa.PrivateKey:
		if bits := k.N.BitLen(); bits < minRSABits {
			return nil, "", fmt.Errorf("%w: RSA key of %d bits; want at least %d", ErrKeyType, bits, minRSABits)
		}
		return k, fmt.Sprintf("RSA %d", k.N.BitLen()), nil
	case *ecdsa.PrivateKey:
		return k, "ECDSA " + k.Curve.Params().Name, nil
	case ed25519.PrivateKey:
		return k, "Ed25519", nil
	}
	return nil, "", fmt.Errorf("%w: %T; want ECDSA, RSA or Ed25519", ErrKeyType, key)
}

// loadCert reads and checks spec's files as of now: a PEM certificate
// chain, leaf first, and exactly one private key (in the key file when
// given, else in the certificate's), matching the leaf; the leaf valid at
// now, for server authentication, naming at least one host. Errors name
// the file at fault.
func loadCert(spec CertSpec, now time.Time) (*entry, error) {
	cp, err := readPEM(spec.Cert)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: %w", spec.Cert, err)
	}
	if len(cp.certs) == 0 {
		return nil, fmt.Errorf("certificate %s: %w", spec.Cert, ErrNoCert)
	}
	keys, keyFile := cp.keys, spec.Cert
	if spec.Key != "" {
		kp, err := readPEM(spec.Key)
		if err != nil {
			return nil, fmt.Errorf("key %s: %w", spec.Key, err)
		}
		keys, keyFile = kp.keys, spec.Key
	}
	switch {
	case len(keys) == 0 && spec.Key == "":
		return nil, fmt.Errorf("certificate %s: %w (append the key to the PEM or give key=KEYFILE)", spec.Cert, ErrNoKey)
	case len(keys) == 0:
		return nil, fmt.Errorf("key %s: %w", spec.Key, ErrNoKey)
	case len(keys) > 1:
		return nil, fmt.Errorf("key %s: %d private keys; want one", keyFile, len(keys))
	}
	priv, keyType, err := parseKey(keys[0])
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", keyFile, err)
	}
	chain := make([]*x509.Certificate, len(cp.certs))
	for i, der := range cp.certs {
		if chain[i], err = x509.ParseCertificate(der); err != nil {
			return nil, fmt.Errorf("certificate %s: certificate %d of the file: %w", spec.Cert, i+1, err)
		}
	}
	for i := 0; i+1 < len(chain); i++ {
		if !bytes.Equal(chain[i].RawIssuer, chain[i+1].RawSubject) {
			return nil, fmt.Errorf("certificate %s: %w: certificate %d (issuer %q) is followed by %d (subject %q)", spec.Cert, ErrChainOrder, i+1, chain[i].Issuer, i+2, chain[i+1].Subject)
		}
	}
	leaf := chain[0]
	pub, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(priv.Public()) {
		return nil, fmt.Errorf("key %s: %w in %s (%s)", keyFile, ErrKeyMismatch, spec.Cert, leaf.Subject)
	}
	if now.Before(leaf.NotBefore) {
		return nil, fmt.Errorf("certificate %s: %w: valid from %s", spec.Cert, ErrNotYetValid, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("certificate %s: %w on %s", spec.Cert, ErrExpired, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if len(leaf.ExtKeyUsage) > 0 && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny) {
		return nil, fmt.Errorf("certificate %s: %w", spec.Cert, ErrNotServerAuth)
	}
	names := certNames(leaf)
	if len(names) == 0 {
		return nil, fmt.Errorf("certificate %s: %w", spec.Cert, ErrNoNames)
	}
	return &entry{
		spec:        spec,
		cert:        &tls.Certificate{Certificate: cp.certs, PrivateKey: priv, Leaf: leaf},
		names:       names,
		fingerprint: sha256.Sum256(leaf.Raw),
		keyType:     keyType,
		loadedAt:    now,
	}, nil
}

// certNames are the host names a leaf serves: its DNS and IP subject
// alternative names, or its common name when it has neither (as clients
// that still read it do). Lower case, without a trailing dot, each once.
func certNames(leaf *x509.Certificate) []string {
	var names []string
	add := func(n string) {
		n = normName(n)
		if n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	for _, n := range leaf.DNSNames {
		add(n)
	}
	for _, ip := range leaf.IPAddresses {
		add(ip.String())
	}
	if len(names) == 0 && leaf.Subject.CommonName != "" {
		add(leaf.Subject.CommonName)
	}
	return names
}

// normName is a host name as it is matched: ASCII lower case, one
// trailing dot dropped. It allocates only for a name with upper case.
func normName(n string) string {
	n = strings.TrimSuffix(n, ".")
	for i := 0; i < len(n); i++ {
		if c := n[i]; 'A' <= c && c <= 'Z' {
			return strings.ToLower(n)
		}
	}
	return n
}

// ipName is the name of a local address's IP, as certNames writes it.
func ipName(a net.Addr) string {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.IP.String()
	case *net.UDPAddr:
		return a.IP.String()
	}
	return ""
}
