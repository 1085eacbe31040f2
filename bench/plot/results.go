package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Row is one line of a run's results.tsv as the peers' run.sh writes it:
// system, metric and value separated by tabs, e.g.
// "http-target	c50.req_per_s	91665".
type Row struct {
	System, Metric, Value string
}

// ReadResults parses results.tsv. Blank lines are skipped; any other line
// without exactly three tab-separated fields is an error naming the line,
// so a truncated or hand-edited file is not silently charted wrong.
func ReadResults(r io.Reader) ([]Row, error) {
	var rows []Row
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 3 || f[0] == "" || f[1] == "" {
			return nil, fmt.Errorf("line %d: want system<TAB>metric<TAB>value, got %q", n, line)
		}
		rows = append(rows, Row{System: f[0], Metric: f[1], Value: f[2]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return rows, nil
}

// Env is what a chart says about the run it shows, from run.sh's env.txt.
type Env struct {
	Date     string // "2026-11-30" (the date part of "date: ...")
	Quota    string // LB_QUOTA in per cent of one core; "" when uncapped
	Duration string // seconds per HTTP point
	SIPSecs  string // seconds per SIP point
	// Load names what the clients sent when it was not plain HTTP
	// ("keep-alive HTTPS", from a "load: ..." line): it replaces "HTTP"
	// in the charts' titles.
	Load string
}

// ReadEnv parses env.txt. Unknown lines are ignored: the file also holds
// tool versions and load averages.
func ReadEnv(r io.Reader) (Env, error) {
	var e Env
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if d, ok := strings.CutPrefix(line, "date:"); ok {
			d = strings.TrimSpace(d)
			if i := strings.IndexByte(d, 'T'); i > 0 {
				d = d[:i]
			}
			e.Date = d
			continue
		}
		if l, ok := strings.CutPrefix(line, "load:"); ok {
			e.Load = strings.TrimSpace(l)
			continue
		}
		if !strings.HasPrefix(line, "pin=") {
			continue
		}
		for _, kv := range strings.Fields(line) {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "lb_quota":
				if v != "none" {
					e.Quota = v
				}
			case "duration":
				e.Duration = v
			case "sip_secs":
				e.SIPSecs = v
			}
		}
	}
	return e, sc.Err()
}

// HTTPPoint is one wrk run: one system at one connection count.
type HTTPPoint struct {
	System    string  // run.sh's name, e.g. "http-nginx"
	Conns     int     // wrk -c
	ReqPerSec float64 // NaN when wrk failed ("FAIL")
	P50, P99  float64 // ms; NaN when missing
	LBCPU     float64 // balancer process CPU, % of one core; NaN when not measured
}

// CPUPerReq is the balancer's CPU time per request in microseconds, NaN
// when either figure is missing.
func (p HTTPPoint) CPUPerReq() float64 { return cpuPer(p.LBCPU, p.ReqPerSec) }

// cpuPer turns "pct % of one core while doing rate things per second" into
// microseconds of CPU per thing.
func cpuPer(pct, rate float64) float64 {
	if math.IsNaN(pct) || math.IsNaN(rate) || rate <= 0 {
		return math.NaN()
	}
	return pct / 100 * 1e6 / rate
}

var connMetric = regexp.MustCompile(`^c([0-9]+)\.(req_per_s|p50_ms|p99_ms|cpu)$`)

// HTTPPoints collects the wrk points of every http-* system, ordered by
// system (first appearance) then connection count.
func HTTPPoints(rows []Row) ([]HTTPPoint, error) {
	type key struct {
		sys   string
		conns int
	}
	idx := map[key]int{}
	var pts []HTTPPoint
	for _, r := range rows {
		if !strings.HasPrefix(r.System, "http-") {
			continue
		}
		m := connMetric.FindStringSubmatch(r.Metric)
		if m == nil {
			continue // errors, check lines and the like
		}
		c, err := strconv.Atoi(m[1])
		if err != nil || c <= 0 {
			return nil, fmt.Errorf("%s %s: bad connection count", r.System, r.Metric)
		}
		k := key{r.System, c}
		i, ok := idx[k]
		if !ok {
			i = len(pts)
			idx[k] = i
			nan := math.NaN()
			pts = append(pts, HTTPPoint{System: r.System, Conns: c, ReqPerSec: nan, P50: nan, P99: nan, LBCPU: nan})
		}
		p := &pts[i]
		switch m[2] {
		case "req_per_s":
			p.ReqPerSec, err = number(r.Value)
		case "p50_ms":
			p.P50, err = number(r.Value)
		case "p99_ms":
			p.P99, err = number(r.Value)
		case "cpu":
			p.LBCPU, err = lbPercent(r.Value)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", r.System, r.Metric, err)
		}
	}
	order := systemOrder(pts, func(p HTTPPoint) string { return p.System })
	slices.SortStableFunc(pts, func(a, b HTTPPoint) int {
		if d := order[a.System] - order[b.System]; d != 0 {
			return d
		}
		return a.Conns - b.Conns
	})
	return pts, nil
}

// SIPResult is one system's SIP sweep: the highest clean call rate and what
// the balancer spent at it.
type SIPResult struct {
	System      string  // run.sh's name, e.g. "sip-kamailio-sl"
	MaxCleanCPS float64 // calls/s; 0 when no rate of the ladder was clean
	NoneClean   string  // run.sh's "<1000" when no rate was clean, else ""
	LBCPU       float64 // balancer process CPU at that rate, % of one core; NaN if none
	P99         float64 // INVITE->200 p99 at that rate in ms; NaN if none
}

// CPUPerCall is the balancer's CPU time per call in microseconds at the
// highest clean rate, NaN when there is none or no balancer (sip-direct).
func (s SIPResult) CPUPerCall() float64 { return cpuPer(s.LBCPU, s.MaxCleanCPS) }

var p99Field = regexp.MustCompile(`p99=([0-9.]+)ms`)

// SIPResults collects every sip-* system that has a max_clean_cps row, in
// order of first appearance (the overload legs have none and are skipped).
func SIPResults(rows []Row) ([]SIPResult, error) {
	idx := map[string]int{}
	var res []SIPResult
	get := func(sys string) *SIPResult {
		i, ok := idx[sys]
		if !ok {
			i = len(res)
			idx[sys] = i
			res = append(res, SIPResult{System: sys, LBCPU: math.NaN(), P99: math.NaN()})
		}
		return &res[i]
	}
	for _, r := range rows {
		if !strings.HasPrefix(r.System, "sip-") {
			continue
		}
		switch r.Metric {
		case "max_clean_cps":
			s := get(r.System)
			if strings.HasPrefix(r.Value, "<") {
				s.NoneClean = r.Value
				continue
			}
			v, err := number(r.Value)
			if err != nil || math.IsNaN(v) {
				return nil, fmt.Errorf("%s max_clean_cps: want a rate or <rate, got %q", r.System, r.Value)
			}
			s.MaxCleanCPS = v
		case "at_max.cpu":
			v, err := lbPercent(r.Value)
			if err != nil {
				return nil, fmt.Errorf("%s at_max.cpu: %w", r.System, err)
			}
			get(r.System).LBCPU = v
		case "at_max.latency":
			if m := p99Field.FindStringSubmatch(r.Value); m != nil {
				v, _ := strconv.ParseFloat(m[1], 64)
				get(r.System).P99 = v
			}
		}
	}
	// a system with latency or CPU rows but no max_clean_cps row is not a sweep
	res = slices.DeleteFunc(res, func(s SIPResult) bool { return s.MaxCleanCPS == 0 && s.NoneClean == "" })
	order := systemOrder(res, func(s SIPResult) string { return s.System })
	slices.SortStableFunc(res, func(a, b SIPResult) int { return order[a.System] - order[b.System] })
	return res, nil
}

// number parses a figure of results.tsv; run.sh writes "FAIL" (and nothing)
// for a run that produced none, which becomes NaN, not an error.
func number(s string) (float64, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "FAIL" {
		return math.NaN(), nil
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "cps"), 64)
	if err != nil {
		return 0, fmt.Errorf("want a number, got %q", s)
	}
	return v, nil
}

// lbPercent reads the balancer's share from run.sh's CPU summary
// "lb=97% gen=88% be=61% cpu0=98% cpu1=99% other=1%"; NaN when the summary
// has no lb field (a run without a balancer).
func lbPercent(s string) (float64, error) {
	for f := range strings.FieldsSeq(s) {
		v, ok := strings.CutPrefix(f, "lb=")
		if !ok {
			continue
		}
		x, err := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
		if err != nil {
			return 0, fmt.Errorf("bad lb CPU %q in %q", f, s)
		}
		return x, nil
	}
	return math.NaN(), nil
}

// systemOrder ranks systems for every chart: sluice (the "target") first,
// the peers after it in the order the run measured them.
func systemOrder[T any](items []T, name func(T) string) map[string]int {
	order := map[string]int{}
	for _, it := range items {
		n := name(it)
		if _, ok := order[n]; ok {
			continue
		}
		if isTarget(n) {
			order[n] = -1
		} else {
			order[n] = len(order) + 1
		}
	}
	return order
}

func isTarget(sys string) bool { return sys == "http-target" || sys == "sip-target" }

// displayNames are the names charts show for run.sh's systems.
var displayNames = map[string]string{
	"http-target":         "sluice",
	"http-haproxy":        "HAProxy",
	"http-haproxy-sticky": "HAProxy (sticky)",
	"http-nginx":          "nginx",
	"http-direct":         "direct (no LB)",
	"sip-target":          "sluice",
	"sip-kamailio":        "Kamailio (tm)",
	"sip-kamailio-sl":     "Kamailio stateless",
	"sip-direct":          "direct (no LB)",
}

// DisplayName is the chart label of a run.sh system name.
func DisplayName(sys string) string {
	if n, ok := displayNames[sys]; ok {
		return n
	}
	return sys
}

// Run is everything charted from one output directory.
type Run struct {
	HTTP    []HTTPPoint
	HTTPEnv Env
	SIP     []SIPResult
	SIPEnv  Env
}

// resultDirs are where a results.tsv may sit below -in: bench/http.sh puts
// run.sh's output in peers/, bench/sip.sh's sweep in sweep/, and run.sh
// alone writes into the directory itself.
var resultDirs = []string{".", "peers", "sweep"}

// ErrNothingToChart means no results.tsv below the directory held an HTTP
// point or a SIP sweep.
var ErrNothingToChart = errors.New("no HTTP points or SIP sweep results")

// LoadRun reads every results.tsv (and the env.txt beside it) of a bench
// output directory.
func LoadRun(dir string) (Run, error) {
	var run Run
	found := false
	for _, sub := range resultDirs {
		d := filepath.Join(dir, sub)
		f, err := os.Open(filepath.Join(d, "results.tsv"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return run, err
		}
		found = true
		rows, err := ReadResults(f)
		f.Close()
		if err != nil {
			return run, fmt.Errorf("%s: %w", f.Name(), err)
		}
		env, err := readEnvFile(filepath.Join(d, "env.txt"))
		if err != nil {
			return run, err
		}
		h, err := HTTPPoints(rows)
		if err != nil {
			return run, fmt.Errorf("%s: %w", f.Name(), err)
		}
		s, err := SIPResults(rows)
		if err != nil {
			return run, fmt.Errorf("%s: %w", f.Name(), err)
		}
		if len(h) > 0 && run.HTTP == nil {
			run.HTTP, run.HTTPEnv = h, env
		}
		if len(s) > 0 && run.SIP == nil {
			run.SIP, run.SIPEnv = s, env
		}
	}
	if !found {
		return run, fmt.Errorf("no results.tsv in %s or its %s subdirectories (is it a bench/http.sh or bench/sip.sh OUT directory?)",
			dir, strings.Join(resultDirs[1:], ", "))
	}
	if run.HTTP == nil && run.SIP == nil {
		return run, fmt.Errorf("%s: %w", dir, ErrNothingToChart)
	}
	return run, nil
}

// readEnvFile reads env.txt if present; a run without one still charts.
func readEnvFile(path string) (Env, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return Env{}, nil
	}
	if err != nil {
		return Env{}, err
	}
	defer f.Close()
	e, err := ReadEnv(f)
	if err != nil {
		return e, fmt.Errorf("%s: %w", path, err)
	}
	return e, nil
}
