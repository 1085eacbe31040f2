package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ciConfig is the short scenario: 100 sessions and 100 dialogs, 10 s at
// 5×. Sessions and calls live 3 s against a 3 s MOP window; each backend
// holds 64 KiB a session against 8 MiB, so the kept sessions (50 a
// backend) fill about 40% of it and MOP's ceiling leaves room for about
// 18 new sessions a second per backend.
func ciConfig(t *testing.T, bin string) config {
	return config{
		Sluice:   bin,
		Sessions: 100, Dialogs: 100,
		Duration: 10 * time.Second, Factor: 5,
		Lifetime: 3 * time.Second, SessionBytes: 64 << 10, BackendMax: 8 << 20,
		MaxHeap: 0.85, Window: 3 * time.Second, Probe: 250 * time.Millisecond, InitialRate: 5,
		Interval: time.Second, DialogInterval: time.Second,
		SetupTimeout: 20 * time.Second, LearnTimeout: 10 * time.Second, LearnFactor: 3,
		Concurrency:    256,
		GoroutineSlack: 100, RSSSlack: 32 << 20,
		Dir: t.TempDir(),
	}
}

// TestOverloadWithoutLoss runs the short scenario through a real `sluice
// run` child process on loopback: every sticky HTTP request and in-dialog
// SIP transaction succeeds, backend memory stays within 2 points of the
// ceiling through the overload, every refusal carries Retry-After, new
// work is never left unanswered, and the balancer's goroutines and RSS do
// not grow past twice their start of overload value (plus a slack).
func TestOverloadWithoutLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("runs sluice under overload for about 35 s")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/sluicelb/sluice/cmd/sluice").CombinedOutput(); err != nil {
		t.Fatalf("go build sluice: %v\n%s", err, out)
	}
	cfg := ciConfig(t, bin)
	var table bytes.Buffer
	cfg.Out = &table
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := run(ctx, cfg)
	if rep != nil {
		rep.print(&table)
	}
	t.Log("\n" + table.String())
	if err != nil {
		t.Fatalf("scenario not carried out: %v", err)
	}
	for _, bad := range rep.verdict() {
		t.Error(bad)
	}
	// The run must have been the one described: the sessions and dialogs
	// sent all along, and the offer really was five times what got in.
	if min := uint64(cfg.Sessions) * uint64(cfg.Duration/cfg.Interval) / 2; rep.AffHTTPSent < min {
		t.Errorf("%d sticky requests sent, want at least %d", rep.AffHTTPSent, min)
	}
	if rep.HTTPSent < 3*rep.HTTPAdmitted || rep.SIPSent < 3*rep.SIPAdmitted {
		t.Errorf("offered HTTP %d for %d admitted, SIP %d for %d: not an overload", rep.HTTPSent, rep.HTTPAdmitted, rep.SIPSent, rep.SIPAdmitted)
	}
}

// TestVerdict: each property, broken alone, fails the run with a reason
// that names it; a run that keeps them all passes.
func TestVerdict(t *testing.T) {
	good := func() *report {
		return &report{
			Cfg:         config{MaxHeap: 0.85, GoroutineSlack: 100, RSSSlack: 32 << 20},
			Names:       []string{"h1", "h2", "s1", "s2"},
			AffHTTPSent: 1000, AffHTTPOK: 1000, AffSIPSent: 500, AffSIPOK: 500,
			HTTPSent: 500, HTTPAdmitted: 100, HTTPRefused: 400,
			SIPSent: 500, SIPAdmitted: 100, SIPRefused: 400,
			MaxMem:       []float64{0.80, 0.86, 0.869, 0.5},
			LoadStartRSS: 20 << 20, LoadEndRSS: 60 << 20, LoadStartGor: 40, LoadEndGor: 170,
		}
	}
	if bad := good().verdict(); len(bad) != 0 {
		t.Fatalf("a good run fails: %v", bad)
	}
	for _, tc := range []struct {
		name  string
		spoil func(r *report)
		want  string
	}{
		{"sticky request failed", func(r *report) { r.AffHTTPOK-- }, "1 of 1000 sticky HTTP requests failed"},
		{"in-dialog failed", func(r *report) { r.AffSIPOK = 0 }, "500 of 500 in-dialog SIP"},
		{"no affinity traffic", func(r *report) { r.AffSIPSent, r.AffSIPOK = 0, 0 }, "no affinity traffic"},
		{"memory over", func(r *report) { r.MaxMem[3] = 0.8701 }, "backend s2 memory reached 87.0%"},
		{"no Retry-After", func(r *report) { r.NoRetryAfter = 1 }, "1 refusals without Retry-After"},
		{"unanswered", func(r *report) { r.NewLost = 2 }, "2 new-work requests got no answer"},
		{"no overload", func(r *report) { r.SIPRefused = 0 }, "no overload"},
		{"goroutines grew", func(r *report) { r.LoadEndGor = 180 }, "goroutines grew from 40 to 180"},
		{"RSS grew", func(r *report) { r.LoadEndRSS = 72 << 20 }, "RSS grew from 20.0 MB to 72.0 MB"},
		{"not sampled", func(r *report) { r.LoadStartRSS = 0 }, "no sample of the balancer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good()
			tc.spoil(r)
			bad := r.verdict()
			if len(bad) != 1 || !strings.Contains(bad[0], tc.want) {
				t.Fatalf("verdict %q, want one reason containing %q", bad, tc.want)
			}
		})
	}
}

// TestRefusedCountsRetryAfter: a refusal without Retry-After is counted
// and kept as an example; one with it is not.
func TestRefusedCountsRetryAfter(t *testing.T) {
	var c counters
	c.refused("http", 503, "1")
	c.refused("sip", 503, " 2 ")
	if n := c.noRetryAfter.Load(); n != 0 {
		t.Fatalf("%d counted without Retry-After, want 0", n)
	}
	c.refused("http", 429, "")
	c.refused("sip", 500, "  ")
	if n := c.noRetryAfter.Load(); n != 2 {
		t.Fatalf("%d counted without Retry-After, want 2", n)
	}
	if len(c.noRA) != 2 || c.noRA[0] != "http 429 without Retry-After" || c.noRA[1] != "sip 500 without Retry-After" {
		t.Fatalf("examples %q", c.noRA)
	}
	if c.refusals["http 503"] != 1 || c.refusals["http 429"] != 1 || c.refusals["sip 500"] != 1 {
		t.Fatalf("refusals by code %v", c.refusals)
	}
}

// TestRetryDelay: Retry-After in seconds, bounded; a missing or bad one
// waits half a second.
func TestRetryDelay(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"1", time.Second}, {"0", 50 * time.Millisecond}, {"30", 2 * time.Second},
		{"", 500 * time.Millisecond}, {"soon", 500 * time.Millisecond}, {" 1 ", time.Second},
	} {
		if got := retryDelay(tc.in, 2*time.Second); got != tc.want {
			t.Errorf("retryDelay(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
