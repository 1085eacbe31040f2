package sip

import (
	"strings"
	"testing"

	gosip "github.com/emiago/sipgo/sip"
)

// A pool whose every backend that would take new work is drained by the
// operator is refused with a Warning naming the pool as drained and
// counted as draining; a pool with no backend up (none drained) is still
// "no backend available".
func TestPoolDrainedRefusal(t *testing.T) {
	ldn, par, def := newUAS(t, "ldn"), newUAS(t, "par"), newUAS(t, "def")
	s := poolServer(t, []string{ldn.addr.String() + ",id=ldn,pool=london", par.addr.String() + ",id=par,pool=paris", def.addr.String() + ",id=def"},
		[]string{"pool=london,user=+4420", "pool=paris,user=+33"}, nil, nil)
	g := s.Generation()
	g.Lookup("ldn").Drain(true)
	g.Lookup("par").Disable(true)
	c := newUAC(t, s.udpAddr())
	for _, tc := range []struct{ ruri, want string }{
		{"sip:+442079460000@voice.example", `"pool london drained"`},
		{"sip:+33123456@voice.example", `"overload: no backend available pool paris"`},
	} {
		c.newCall().inviteTo(tc.ruri, "a.example")
		res := c.awaitResponse(gosip.INVITE, 503, 200)
		if w := warning(res); !strings.HasSuffix(w, tc.want) {
			t.Errorf("%s: Warning %q, want it to end %s", tc.ruri, w, tc.want)
		}
	}
	got := series(t, s)
	for name, want := range map[string]float64{
		`sluice_sip_pool_refused_total{pool=london,reason=draining}`:   1,
		`sluice_sip_pool_refused_total{pool=london,reason=no_backend}`: 0,
		`sluice_sip_pool_refused_total{pool=paris,reason=no_backend}`:  1,
		`sluice_sip_pool_refused_total{pool=paris,reason=draining}`:    0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
	if n := ldn.count(gosip.INVITE, ""); n != 0 {
		t.Errorf("the drained backend got %d INVITEs", n)
	}
}
