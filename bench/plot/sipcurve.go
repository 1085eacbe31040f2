package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// SIPCurvePoint is one line of bench/sip-cpu.sh curve's curve-summary.tsv:
// a system's median CPU per call, and its resident memory, at one size of
// one axis.
type SIPCurvePoint struct {
	System string // sluice, kamailio
	Axis   string // dialogs (live dialogs) or transport (TCP connections; 0 is UDP)
	Size   int
	UsCall float64 // CPU µs per completed call (store process included)
	RSSKB  int     // resident memory of the system's processes before the load
	Failed int
	Runs   int
}

// ParseSIPCurve reads curve-summary.tsv: a header line, then system, axis,
// size, us_per_call, rss_kb, failed, runs, tab-separated.
func ParseSIPCurve(r io.Reader) ([]SIPCurvePoint, error) {
	var pts []SIPCurvePoint
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		if line > maxIdleLines {
			return nil, fmt.Errorf("over %d lines", maxIdleLines)
		}
		text := strings.TrimSpace(sc.Text())
		if text == "" || line == 1 && strings.HasPrefix(text, "system\t") {
			continue
		}
		f := strings.Split(text, "\t")
		if len(f) != 7 {
			return nil, fmt.Errorf("line %d: %d fields, want 7 (system, axis, size, us_per_call, rss_kb, failed, runs)", line, len(f))
		}
		if f[1] != "dialogs" && f[1] != "transport" {
			return nil, fmt.Errorf("line %d: axis %q: want dialogs or transport", line, f[1])
		}
		var ints [4]int
		for i, k := range []int{2, 4, 5, 6} {
			v, err := strconv.Atoi(f[k])
			if err != nil || v < 0 {
				return nil, fmt.Errorf("line %d: field %d %q: want a whole number", line, k+1, f[k])
			}
			ints[i] = v
		}
		us, err := strconv.ParseFloat(f[3], 64)
		if err != nil || math.IsNaN(us) || math.IsInf(us, 0) || us < 0 {
			return nil, fmt.Errorf("line %d: us_per_call %q: want a number", line, f[3])
		}
		pts = append(pts, SIPCurvePoint{f[0], f[1], ints[0], us, ints[1], ints[2], ints[3]})
	}
	return pts, sc.Err()
}

// sipCurveCharts are the files `plot sipcurve` writes, each drawing one
// axis's points.
var sipCurveCharts = []struct {
	file, axis, title, xlabel, ylabel string
	y                                 func(SIPCurvePoint) float64
}{
	{"sip-curve-dialogs.png", "dialogs", "SIP CPU per call as the dialog table grows (UDP, uac_rr, live dialogs restored from the store)",
		"live dialogs before the load (log scale)", "CPU µs per call (balancer + store process)", func(p SIPCurvePoint) float64 { return p.UsCall }},
	{"sip-curve-dialogs-mem.png", "dialogs", "SIP memory with the dialogs restored (RSS of the balancer and its store process, before the load)",
		"live dialogs (log scale)", "resident MB", func(p SIPCurvePoint) float64 { return float64(p.RSSKB) / 1024 }},
	{"sip-curve-transport.png", "transport", "SIP CPU per call: UDP against TCP clients (calls spread over the connections)",
		"client TCP connections (log scale; UDP at the left)", "CPU µs per call (all the system's processes)", func(p SIPCurvePoint) float64 { return p.UsCall }},
}

// sipCurveChart draws one chart of sipCurveCharts: y against size (log x,
// size 0 left of the smallest other: "UDP" on the transport axis), one
// line per system, failed calls named in the legend.
func sipCurveChart(w io.Writer, i int, pts []SIPCurvePoint) error {
	c := sipCurveCharts[i]
	var mine []SIPCurvePoint
	for _, p := range pts {
		if p.Axis == c.axis && c.y(p) > 0 {
			mine = append(mine, p)
		}
	}
	if len(mine) == 0 {
		return fmt.Errorf("%s: no points on the %s axis", c.file, c.axis)
	}
	lo := math.MaxInt
	var sizes []int
	var systems []string
	ymax := 0.0
	for _, p := range mine {
		if p.Size > 0 {
			lo = min(lo, p.Size)
		}
		if !slices.Contains(sizes, p.Size) {
			sizes = append(sizes, p.Size)
		}
		if !slices.Contains(systems, p.System) {
			systems = append(systems, p.System)
		}
		ymax = max(ymax, c.y(p))
	}
	slices.Sort(sizes)
	xAt := func(n int) float64 {
		if n == 0 {
			return zeroAt(lo)
		}
		return float64(n)
	}
	p := plot.New()
	p.Title.Text = c.title + "\nbench/sip-cpu.sh curve, median of the rounds per point"
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.X.Label.Text = c.xlabel
	p.X.Scale = plot.LogScale{}
	var ticks []plot.Tick
	for _, n := range sizes {
		label := fmtThousands(float64(n))
		if n == 0 && c.axis == "transport" {
			label = "UDP"
		}
		ticks = append(ticks, plot.Tick{Value: xAt(n), Label: label})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = xAt(sizes[0])/1.5, xAt(sizes[len(sizes)-1])*1.5
	p.Y.Label.Text = c.ylabel
	p.Y.Min, p.Y.Max = 0, ymax*1.3
	p.Y.Tick.Marker = wholeTicks{}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Add(plotter.NewGrid())
	for i, s := range systems {
		var xys plotter.XYs
		failed := 0
		for _, q := range mine {
			if q.System == s {
				xys = append(xys, plotter.XY{X: xAt(q.Size), Y: c.y(q)})
				failed += q.Failed
			}
		}
		name := s
		if failed > 0 {
			name += fmt.Sprintf(" (%d failed calls)", failed)
		}
		if err := addCurve(p, i, name, xys, false); err != nil {
			return fmt.Errorf("%s: %s: %w", c.file, s, err)
		}
	}
	return writePNG(w, httpChartW, func(dc draw.Canvas) { p.Draw(dc) })
}

// sipCurveMain is `plot sipcurve`: curve-summary.tsv in, the charts of
// sipCurveCharts out (those whose axis has points).
func sipCurveMain(args []string) error {
	fs := flag.NewFlagSet("sipcurve", flag.ContinueOnError)
	in := fs.String("in", "", "bench/sip-cpu.sh curve's OUT/curve-summary.tsv")
	out := fs.String("out", "", "directory for the PNGs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" || *out == "" || fs.NArg() > 0 {
		return fmt.Errorf("usage: plot sipcurve -in CURVE_SUMMARY_TSV -out DIR")
	}
	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer f.Close()
	pts, err := ParseSIPCurve(f)
	if err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("creating output directory: %w", err)
	}
	wrote := 0
	for i, c := range sipCurveCharts {
		if !slices.ContainsFunc(pts, func(p SIPCurvePoint) bool { return p.Axis == c.axis }) {
			continue
		}
		var buf bytes.Buffer
		if err := sipCurveChart(&buf, i, pts); err != nil {
			return err
		}
		p := filepath.Join(*out, c.file)
		if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
			return fmt.Errorf("writing chart: %w", err)
		}
		fmt.Println(p)
		wrote++
	}
	if wrote == 0 {
		return fmt.Errorf("%s: no points", *in)
	}
	return nil
}
