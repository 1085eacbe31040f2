package main

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// same compares figures where NaN (no figure) equals NaN.
func same(a, b float64) bool {
	return a == b || math.IsNaN(a) && math.IsNaN(b) || math.Abs(a-b) < 1e-9
}

func TestReadResults(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []Row
		wantErr string
	}{
		{name: "three fields, blank lines skipped, CRLF tolerated",
			in:   "http-nginx\tc50.req_per_s\t83718\r\n\nhttp-nginx\tc50.cpu\tlb=97% gen=88%\n",
			want: []Row{{"http-nginx", "c50.req_per_s", "83718"}, {"http-nginx", "c50.cpu", "lb=97% gen=88%"}}},
		{name: "empty value kept", in: "sip-target\tat_max.latency\t\n",
			want: []Row{{"sip-target", "at_max.latency", ""}}},
		{name: "two fields", in: "http-nginx\tc50.req_per_s\t1\nhttp-nginx\tc50.p99_ms\n", wantErr: "line 2"},
		{name: "spaces instead of tabs", in: "http-nginx c50.req_per_s 1\n", wantErr: "line 1"},
		{name: "four fields", in: "a\tb\tc\td\n", wantErr: "line 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadResults(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d rows %v, want %v", len(got), got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("row %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestReadEnv(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Env
	}{
		{name: "uncapped",
			in:   "date: 2026-11-30T10:20:01+00:00\nhost: 2 cpus\npin=1 lb_cpus=0 gen_cpus=1 lb_quota=none duration=5 conns=50 200 sip_secs=10\n",
			want: Env{Date: "2026-11-30", Duration: "5", SIPSecs: "10"}},
		{name: "quota", in: "date: 2026-12-01T09:00:00+00:00\npin=1 lb_quota=50 duration=10 sip_secs=5\n",
			want: Env{Date: "2026-12-01", Quota: "50", Duration: "10", SIPSecs: "5"}},
		{name: "load", in: "date: 2026-12-02T02:50:02+00:00\nload: keep-alive HTTPS (wrk https://)\npin=1 lb_quota=50 duration=8\n",
			want: Env{Date: "2026-12-02", Quota: "50", Duration: "8", Load: "keep-alive HTTPS (wrk https://)"}},
		{name: "nothing known", in: "nginx version: nginx/1.22.1\n", want: Env{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadEnv(strings.NewReader(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestLBPercent(t *testing.T) {
	tests := []struct {
		in      string
		want    float64
		wantErr bool
	}{
		{"lb=97% gen=88% be=61% cpu0=98% cpu1=99% other=1%", 97, false},
		{"gen=12% be=30% cpu0=5% cpu1=60% other=0%", math.NaN(), false}, // sip-direct: no balancer
		{"lb=4.5% gen=1%", 4.5, false},
		{"lb=lots gen=1%", 0, true},
	}
	for _, tc := range tests {
		got, err := lbPercent(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("lbPercent(%q) err = %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if !tc.wantErr && !same(got, tc.want) {
			t.Errorf("lbPercent(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestHTTPPoints(t *testing.T) {
	rows := []Row{
		{"http-haproxy", "check", "rr=b1,b2 sticky(SRV=b1)->b1"},
		{"http-haproxy", "c200.req_per_s", "64003"},
		{"http-haproxy", "c200.cpu", "lb=99% gen=90%"},
		{"http-haproxy", "c50.req_per_s", "77140"},
		{"http-haproxy", "c50.errors", "non2xx=0 sock=0"},
		{"http-target", "c50.req_per_s", "FAIL"},
		{"http-target", "c50.p50_ms", ""},
		{"http-target", "c50.p99_ms", ""},
		{"http-target", "c50.cpu", "lb=95% gen=1%"},
		{"http-target", "c200.req_per_s", "50000"},
		{"http-target", "c200.p99_ms", "3.42"},
		{"http-target", "c200.cpu", "lb=50% gen=1%"},
		{"sip-target", "max_clean_cps", "8000"},
	}
	got, err := HTTPPoints(rows)
	if err != nil {
		t.Fatal(err)
	}
	nan := math.NaN()
	want := []HTTPPoint{ // sluice first, then connection counts ascending
		{System: "http-target", Conns: 50, ReqPerSec: nan, P50: nan, P99: nan, LBCPU: 95},
		{System: "http-target", Conns: 200, ReqPerSec: 50000, P50: nan, P99: 3.42, LBCPU: 50},
		{System: "http-haproxy", Conns: 50, ReqPerSec: 77140, P50: nan, P99: nan, LBCPU: nan},
		{System: "http-haproxy", Conns: 200, ReqPerSec: 64003, P50: nan, P99: nan, LBCPU: 99},
	}
	checkHTTP(t, got, want)
	// 50 % of a core for 50,000 req/s is 10 us per request; no figure without req/s
	if v := got[1].CPUPerReq(); !same(v, 10) {
		t.Errorf("CPUPerReq = %v, want 10", v)
	}
	if v := got[0].CPUPerReq(); !math.IsNaN(v) {
		t.Errorf("CPUPerReq of a failed point = %v, want NaN", v)
	}

	if _, err := HTTPPoints([]Row{{"http-nginx", "c50.req_per_s", "fast"}}); err == nil || !strings.Contains(err.Error(), "http-nginx c50.req_per_s") {
		t.Errorf("bad req/s: err = %v, want one naming the row", err)
	}
}

func checkHTTP(t *testing.T, got, want []HTTPPoint) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d points %+v, want %d", len(got), got, len(want))
	}
	for i, g := range got {
		w := want[i]
		if g.System != w.System || g.Conns != w.Conns || !same(g.ReqPerSec, w.ReqPerSec) ||
			!same(g.P50, w.P50) || !same(g.P99, w.P99) || !same(g.LBCPU, w.LBCPU) {
			t.Errorf("point %d = %+v, want %+v", i, g, w)
		}
	}
}

func TestSIPResults(t *testing.T) {
	rows := []Row{
		{"sip-kamailio", "max_clean_cps", "4000"},
		{"sip-kamailio", "at_max.latency", "invite->200 p50=8ms p99=52ms max=136ms (1 ms resolution)"},
		{"sip-kamailio", "at_max.cpu", "lb=96% gen=70% be=40% cpu0=97% cpu1=90% other=2%"},
		{"sip-kamailio", "first_unclean", "r=6000 ok=1 failed=5"},
		{"sip-direct", "max_clean_cps", "<2000"},
		{"sip-direct", "first_unclean", "r=2000 ..."},
		{"sip-target-overload", "invite_200", "4519"},
		{"sip-target", "max_clean_cps", "8000"},
		{"sip-target", "at_max.latency", "invite->200 p50=0ms p99=16ms max=64ms (1 ms resolution)"},
		{"sip-target", "at_max.cpu", "lb=54% gen=80% be=50% cpu0=60% cpu1=99% other=1%"},
		{"http-target", "c50.req_per_s", "90000"},
	}
	got, err := SIPResults(rows)
	if err != nil {
		t.Fatal(err)
	}
	nan := math.NaN()
	want := []SIPResult{
		{System: "sip-target", MaxCleanCPS: 8000, LBCPU: 54, P99: 16},
		{System: "sip-kamailio", MaxCleanCPS: 4000, LBCPU: 96, P99: 52},
		{System: "sip-direct", NoneClean: "<2000", LBCPU: nan, P99: nan},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i, g := range got {
		w := want[i]
		if g.System != w.System || g.MaxCleanCPS != w.MaxCleanCPS || g.NoneClean != w.NoneClean ||
			!same(g.LBCPU, w.LBCPU) || !same(g.P99, w.P99) {
			t.Errorf("result %d = %+v, want %+v", i, g, w)
		}
	}
	// 54 % of a core for 8,000 calls/s is 67.5 us per call; 96 % for 4,000 is 240
	for i, w := range []float64{67.5, 240, nan} {
		if v := got[i].CPUPerCall(); !same(v, w) {
			t.Errorf("%s CPUPerCall = %v, want %v", got[i].System, v, w)
		}
	}

	if _, err := SIPResults([]Row{{"sip-target", "max_clean_cps", "lots"}}); err == nil {
		t.Error("max_clean_cps \"lots\": no error")
	}
}

// TestLoadRunTestdata reads output directories in the layout and format of
// real runs: testdata/http is bench/http.sh's OUT (results in peers/),
// testdata/sip bench/sip.sh's (results in sweep/), testdata/http-quota an
// LB_QUOTA=50 run.
func TestLoadRunTestdata(t *testing.T) {
	t.Run("http", func(t *testing.T) {
		r, err := LoadRun("testdata/http")
		if err != nil {
			t.Fatal(err)
		}
		if r.SIP != nil {
			t.Errorf("SIP results from an HTTP run: %+v", r.SIP)
		}
		checkHTTP(t, r.HTTP, []HTTPPoint{
			{System: "http-target", Conns: 50, ReqPerSec: 62918, P50: 0.58, P99: 7.26, LBCPU: 79},
			{System: "http-target", Conns: 200, ReqPerSec: 33131, P50: 4.06, P99: 153.45, LBCPU: 38},
			{System: "http-haproxy", Conns: 50, ReqPerSec: 62948, P50: 0.67, P99: 6.08, LBCPU: 86},
			{System: "http-haproxy", Conns: 200, ReqPerSec: 54378, P50: 3.28, P99: 17.00, LBCPU: 90},
			{System: "http-nginx", Conns: 50, ReqPerSec: 40992, P50: 0.77, P99: 9.39, LBCPU: 59},
			{System: "http-nginx", Conns: 200, ReqPerSec: 54221, P50: 2.81, P99: 46.83, LBCPU: 77},
		})
		if want := (Env{Date: "2026-11-30", Duration: "5", SIPSecs: "10"}); r.HTTPEnv != want {
			t.Errorf("env = %+v, want %+v", r.HTTPEnv, want)
		}
	})
	t.Run("http-quota", func(t *testing.T) {
		r, err := LoadRun("testdata/http-quota")
		if err != nil {
			t.Fatal(err)
		}
		if r.HTTPEnv.Quota != "50" {
			t.Errorf("quota = %q, want 50", r.HTTPEnv.Quota)
		}
		for _, p := range r.HTTP {
			// the cap holds every balancer to half a core, give or take sampling
			if !(p.LBCPU > 0 && p.LBCPU <= 55) || math.IsNaN(p.CPUPerReq()) {
				t.Errorf("%s c%d: lb CPU %v%%, %v us/request under a 50%% quota", p.System, p.Conns, p.LBCPU, p.CPUPerReq())
			}
		}
	})
	t.Run("sip-quota", func(t *testing.T) {
		r, err := LoadRun("testdata/sip-quota")
		if err != nil {
			t.Fatal(err)
		}
		nan := math.NaN()
		want := []SIPResult{
			{System: "sip-target", NoneClean: "<1000", LBCPU: nan, P99: nan},
			{System: "sip-kamailio-sl", MaxCleanCPS: 1000, LBCPU: 23, P99: 16},
		}
		if len(r.SIP) != len(want) {
			t.Fatalf("got %+v, want %+v", r.SIP, want)
		}
		for i, g := range r.SIP {
			w := want[i]
			if g.System != w.System || g.MaxCleanCPS != w.MaxCleanCPS || g.NoneClean != w.NoneClean ||
				!same(g.LBCPU, w.LBCPU) || !same(g.P99, w.P99) {
				t.Errorf("result %d = %+v, want %+v", i, g, w)
			}
		}
		if r.SIPEnv.Quota != "50" {
			t.Errorf("quota = %q, want 50", r.SIPEnv.Quota)
		}
	})
	t.Run("sip", func(t *testing.T) {
		r, err := LoadRun("testdata/sip")
		if err != nil {
			t.Fatal(err)
		}
		if r.HTTP != nil {
			t.Errorf("HTTP points from a SIP run: %+v", r.HTTP)
		}
		if len(r.SIP) == 0 || r.SIP[0].System != "sip-target" {
			t.Fatalf("SIP results %+v: want sluice first", r.SIP)
		}
		if r.SIPEnv.Date == "" || r.SIPEnv.SIPSecs == "" {
			t.Errorf("env = %+v: want date and seconds per point", r.SIPEnv)
		}
	})
}

func TestLoadRunErrors(t *testing.T) {
	empty := t.TempDir()
	if _, err := LoadRun(empty); err == nil || !strings.Contains(err.Error(), "no results.tsv") {
		t.Errorf("empty dir: err = %v, want no results.tsv", err)
	}

	overloadOnly := t.TempDir()
	writeFile(t, filepath.Join(overloadOnly, "results.tsv"), "sip-target-overload\tinvite_200\t4519\n")
	if _, err := LoadRun(overloadOnly); !errors.Is(err, ErrNothingToChart) {
		t.Errorf("overload-only run: err = %v, want ErrNothingToChart", err)
	}

	bad := t.TempDir()
	writeFile(t, filepath.Join(bad, "peers", "results.tsv"), "http-nginx\tc50.req_per_s\t1\ntruncated line\n")
	_, err := LoadRun(bad)
	if err == nil || !strings.Contains(err.Error(), filepath.Join("peers", "results.tsv")) || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("malformed file: err = %v, want one naming the file and line 2", err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
