package node

import (
	"testing"

	lbhttp "github.com/sluicelb/sluice/http"
	"github.com/sluicelb/sluice/lb"
)

// TestFaultHTTPProber: which active check an HTTP backend gets from
// -health-path and its own health=PATH.
func TestFaultHTTPProber(t *testing.T) {
	for _, tc := range []struct {
		flag, backend string
		want          lb.Prober
	}{
		{"", "", lb.HTTPProber{Path: "/", AnyBelow500: true}},
		{"/healthz", "", lb.HTTPProber{Path: "/healthz"}},
		{"-", "", lb.TCPProber{}},
		{"-", "/own", lb.HTTPProber{Path: "/own"}},
		{"/healthz", "/own", lb.HTTPProber{Path: "/own"}},
	} {
		if got := httpProber(tc.flag, lbhttp.BackendSpec{HealthPath: tc.backend}); got != tc.want {
			t.Errorf("httpProber(%q, %q) = %#v, want %#v", tc.flag, tc.backend, got, tc.want)
		}
	}
	for _, p := range []string{"", "-", "/", "/healthz?deep=1"} {
		if err := checkHealthPath(p); err != nil {
			t.Errorf("checkHealthPath(%q): %v", p, err)
		}
	}
	for _, p := range []string{"healthz", "/a b", "http://x/", "/x#y"} {
		if err := checkHealthPath(p); err == nil {
			t.Errorf("checkHealthPath(%q) accepted", p)
		}
	}
}
