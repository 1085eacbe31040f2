package tlsedge

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// Config is what a node builds its Store and HandshakeLimiter from;
// cmd/sluice fills it from the -tls-* flags.
type Config struct {
	// Certs are the -tls-cert specs, CERTFILE[,key=KEYFILE], in order:
	// the first is the default certificate (no SNI, or a name no
	// certificate has).
	Certs []string
	// HandshakesMax bounds the TLS and WebSocket handshakes in flight
	// across the node's listeners (-tls-handshakes-max); 0: no bound.
	HandshakesMax int
	// HandshakeRate caps the handshakes started per second
	// (-tls-handshake-rate), with a burst of one second's worth; 0: no cap.
	HandshakeRate float64
	// HandshakeTimeout bounds one handshake (-tls-handshake-timeout): a
	// client that has not finished by then is closed.
	HandshakeTimeout time.Duration
}

// Defaults of Config.
const (
	DefaultHandshakesMax    = 256
	DefaultHandshakeRate    = 1000
	DefaultHandshakeTimeout = 10 * time.Second
)

// DefaultConfig returns the defaults: no certificate, 256 handshakes in
// flight, 1000 handshakes a second, a 10 s handshake timeout.
func DefaultConfig() Config {
	return Config{HandshakesMax: DefaultHandshakesMax, HandshakeRate: DefaultHandshakeRate, HandshakeTimeout: DefaultHandshakeTimeout}
}

// fieldError is a FieldError of this package's Config.
func fieldError(field, format string, a ...any) error {
	return admission.NewFieldError("tlsedge", field, format, a...)
}

// Validate checks every field, certificates' specs included (not their
// files: New reads those). Errors are FieldErrors naming the field.
func (c Config) Validate() error {
	if c.HandshakesMax < 0 {
		return fieldError("HandshakesMax", "%d: must not be negative (0: no bound)", c.HandshakesMax)
	}
	if c.HandshakeRate < 0 || math.IsNaN(c.HandshakeRate) || math.IsInf(c.HandshakeRate, 0) {
		return fieldError("HandshakeRate", "%v: want a number of handshakes per second, 0 or more (0: no cap)", c.HandshakeRate)
	}
	if c.HandshakeTimeout <= 0 {
		return fieldError("HandshakeTimeout", "%v: must be positive", c.HandshakeTimeout)
	}
	for _, s := range c.Certs {
		if _, err := ParseCertSpec(s); err != nil {
			return fieldError("Certs", "%w", err)
		}
	}
	return nil
}

// CertSpec is one parsed -tls-cert: the PEM file holding the certificate
// chain (leaf first) and the file holding its private key ("" when the
// key sits in the same PEM, as HAProxy's crt).
type CertSpec struct {
	Cert string
	Key  string
}

// String is the spec as ParseCertSpec reads it.
func (c CertSpec) String() string {
	if c.Key == "" {
		return c.Cert
	}
	return c.Cert + ",key=" + c.Key
}

// ErrSpec is wrapped by every error of ParseCertSpec.
var ErrSpec = errors.New("want CERTFILE[,key=KEYFILE]")

// ParseCertSpec parses a -tls-cert value, CERTFILE[,key=KEYFILE]. Errors
// quote the value and say what is wanted; the files are not read.
func ParseCertSpec(s string) (CertSpec, error) {
	parts := strings.Split(s, ",")
	var spec CertSpec
	spec.Cert = strings.TrimSpace(parts[0])
	switch {
	case spec.Cert == "":
		return CertSpec{}, fmt.Errorf("%q: no certificate file: %w", s, ErrSpec)
	case strings.HasPrefix(spec.Cert, "key="):
		return CertSpec{}, fmt.Errorf("%q: the certificate file comes first: %w", s, ErrSpec)
	}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		switch {
		case !ok || k != "key":
			return CertSpec{}, fmt.Errorf("%q: option %q unknown: %w", s, strings.TrimSpace(p), ErrSpec)
		case spec.Key != "":
			return CertSpec{}, fmt.Errorf("%q: key= given twice: %w", s, ErrSpec)
		case strings.TrimSpace(v) == "":
			return CertSpec{}, fmt.Errorf("%q: key= without a file: %w", s, ErrSpec)
		}
		spec.Key = strings.TrimSpace(v)
	}
	return spec, nil
}
