package http

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/lb"
)

// TestStickyCookieHidesBackend: the sticky cookie names its backend, whose
// id is its address, to the balancer only; the balancer's key ring still
// reads it back, with the pool it was issued in.
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
	h := string(sc.header(&slot, "api", "/api", b, now, false))
	if strings.Contains(h, "Secure") {
		t.Errorf("Set-Cookie value %q for a plain client: want no Secure", h)
	}
	// A TLS client gets the same cookie, Secure, from the same cache slot.
	if hs := string(sc.header(&slot, "api", "/api", b, now, true)); hs != h+"; Secure" {
		t.Errorf("Set-Cookie value for a TLS client %q: want %q", hs, h+"; Secure")
	}
	if h2 := string(sc.header(&slot, "api", "/api", b, now, false)); h2 != h {
		t.Errorf("Set-Cookie value from the cache %q: want %q", h2, h)
	}
	if !strings.Contains(h, "; Path=/api;") {
		t.Errorf("Set-Cookie value %q: want the pool's Path=/api", h)
	}
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
	if pool, id, _, ok := signer.VerifyPool(tok, now); !ok || id != addr || pool != "api" {
		t.Errorf("VerifyPool(cookie) = %q, %q, %v; want api, %q, true", pool, id, ok, addr)
	}
}

// TestBackendCannotSetStickyCookie: a backend's Set-Cookie for the
// balancer's cookie never reaches the client (counted), on new work and
// on affinity answers; the balancer's own cookie still goes out, and other
// cookies pass.
func TestBackendCannotSetStickyCookie(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2})
		for _, be := range r.backends {
			be.handler = func(ctx *fasthttp.RequestCtx) {
				ctx.Response.Header.Add("Set-Cookie", "SLUICE=planted-by-"+be.name+"; Path=/; Domain=example.com")
				ctx.Response.Header.Add("Set-Cookie", "SLUICE=again; Path=/x")
				ctx.Response.Header.Add("Set-Cookie", "app=1; Path=/")
				ctx.SetBodyString(be.name)
			}
		}
		first := r.get("/", "")
		var own int
		for _, sc := range first.header.Values("Set-Cookie") {
			if strings.HasPrefix(sc, "SLUICE=") {
				if strings.Contains(sc, "planted") || strings.Contains(sc, "again") {
					t.Errorf("backend's Set-Cookie reached the client: %q", sc)
				}
				own++
			}
		}
		if own != 1 {
			t.Errorf("new work: %d SLUICE Set-Cookie, want sluice's own alone: %q", own, first.header.Values("Set-Cookie"))
		}
		cookie := stickyFrom(t, first)
		rep := r.get("/", cookie)
		for _, sc := range rep.header.Values("Set-Cookie") {
			if strings.HasPrefix(sc, "SLUICE=") {
				t.Errorf("affinity answer carries %q", sc)
			}
		}
		if got := strings.Join(rep.header.Values("Set-Cookie"), "|"); got != "app=1; Path=/" {
			t.Errorf("other cookies: %q", got)
		}
		if n := r.srv.Stats().CookieStripped.Load(); n != 4 {
			t.Errorf("CookieStripped = %d, want 4 (two per answer)", n)
		}
	})
}

// TestStickyAnyValidCookie: a request carrying several SLUICE cookies (one
// planted for a parent domain, garbage, expired) is pinned by the valid
// one wherever it is, on every request, and not re-pinned.
func TestStickyAnyValidCookie(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 3})
		first := r.get("/", "")
		valid := stickyFrom(t, first)
		for _, cookie := range []string{
			"SLUICE=garbage; " + valid,
			"SLUICE=; SLUICE=AAAA; other=1; " + valid + "; SLUICE=zzz",
			valid + "; SLUICE=garbage",
		} {
			for i := range 6 {
				rep := r.get("/", cookie)
				if rep.body != first.body {
					t.Fatalf("%q request %d went to %s, pinned to %s", cookie, i, rep.body, first.body)
				}
				if sc := rep.header.Get("Set-Cookie"); sc != "" {
					t.Fatalf("%q request %d re-pinned: %q", cookie, i, sc)
				}
			}
		}
	})
}

// TestStickyCookieValuesBounded: at most maxCookieValues values of the
// cookie are checked; a valid one after that many invalid ones is new work.
func TestStickyCookieValuesBounded(t *testing.T) {
	var h fasthttp.RequestHeader
	var parts []string
	for i := range maxCookieValues + 3 {
		parts = append(parts, fmt.Sprintf("SLUICE=v%d", i))
	}
	h.Set("Cookie", strings.Join(parts, "; ")+"; other=x")
	var got []string
	for v := range cookieValues(&h, "SLUICE") {
		got = append(got, string(v))
	}
	if want := strings.Join(parts[:maxCookieValues], "|"); strings.Join(got, "|") != strings.ReplaceAll(want, "SLUICE=", "") {
		t.Errorf("cookieValues = %q, want the first %d of %q", got, maxCookieValues, parts)
	}
}
