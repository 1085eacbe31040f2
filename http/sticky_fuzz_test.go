package http

import (
	"io"
	nethttp "net/http"
	"testing"
	"time"
)

// FuzzStickyCookie: whatever the sticky cookie's value, a request passes as
// affinity only when the value is a token the balancer signed for a live
// backend and that has not expired. New work is refused for the whole run
// (an hourly ARM limit used up before fuzzing), so a 200 is affinity; the
// genuine token's 200 shows that affinity is what lets it through.
func FuzzStickyCookie(f *testing.F) {
	r := newRig(f, rigOpts{backends: 2, arm: []string{"name=all,limit=1/h,action=reject"}})
	genuine := r.signer.Token("b0", time.Now().Add(time.Hour))
	f.Add(genuine)
	f.Add(r.signer.Token("b1", time.Now().Add(-time.Second))) // expired
	f.Add(r.signer.Token("nope", time.Now().Add(time.Hour)))  // no such backend
	f.Add(genuine[:len(genuine)-1])
	f.Add(genuine + "A")
	f.Add("b0")
	f.Add("")
	f.Add("AQAAAAB")
	if rep := r.get("/", ""); rep.status != 200 {
		f.Fatalf("first request (uses up the ARM limit): %d", rep.status)
	}
	if rep := r.get("/", ""); rep.status != 429 {
		f.Fatalf("second request without a cookie: %d, want 429", rep.status)
	}
	f.Fuzz(func(t *testing.T, v string) {
		for i := 0; i < len(v); i++ { // RFC 6265 cookie-octet; others cannot be sent
			if c := v[i]; c < 0x21 || c > 0x7e || c == '"' || c == ',' || c == ';' || c == '\\' {
				return
			}
		}
		req, err := nethttp.NewRequest("GET", "http://"+r.addr+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Cookie", "SLUICE="+v)
		resp, err := r.client.Do(req)
		if err != nil {
			t.Fatalf("cookie %q: %v", v, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		id, ok := r.signer.Verify(v, time.Now())
		live := ok && (id == "b0" || id == "b1")
		switch {
		case resp.StatusCode == 200 && !live:
			t.Fatalf("cookie %q (verify %q %v) admitted as affinity", v, id, ok)
		case resp.StatusCode != 200 && live:
			t.Fatalf("genuine cookie %q for %s: status %d, want 200", v, id, resp.StatusCode)
		case resp.StatusCode != 200 && resp.StatusCode != 429:
			t.Fatalf("cookie %q: status %d, want 429 (new work refused)", v, resp.StatusCode)
		}
	})
}
