package http

import (
	"bytes"
	"encoding/base64"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicelb/sluice/lb"
)

// TestStickyCookieHidesBackend: the sticky cookie names its backend, whose
// id is its address, to the balancer only; the balancer's key ring still
// reads it back.
func TestStickyCookieHidesBackend(t *testing.T) {
	signer, err := lb.NewRingSigner([]lb.Key{{ID: 4, Secret: []byte("cookie key, sixteen+ bytes long.")}})
	if err != nil {
		t.Fatal(err)
	}
	const addr = "10.20.30.40:8080"
	b, err := lb.NewBackend(lb.BackendConfig{ID: addr, Addr: addr, Proto: "http"})
	if err != nil {
		t.Fatal(err)
	}
	sc := newStickyCookie("SLUICE", time.Hour, signer)
	now := time.Unix(1_800_000_000, 0)
	var slot atomic.Pointer[cookieValue]
	h := string(sc.header(&slot, b, now))
	tok, _, ok := strings.Cut(strings.TrimPrefix(h, "SLUICE="), ";")
	if !ok || !strings.HasPrefix(h, "SLUICE=") {
		t.Fatalf("Set-Cookie value %q", h)
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		t.Fatalf("cookie token %q: %v", tok, err)
	}
	ip := netip.MustParseAddr("10.20.30.40").AsSlice()
	for _, leak := range [][]byte{[]byte(addr), []byte("10.20.30.40"), []byte("8080"), ip} {
		if bytes.Contains(raw, leak) {
			t.Errorf("cookie token %q contains %q", tok, leak)
		}
	}
	if id, ok := signer.Verify(tok, now); !ok || id != addr {
		t.Errorf("Verify(cookie) = %q, %v; want %q, true", id, ok, addr)
	}
}
